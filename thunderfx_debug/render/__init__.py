"""Renderers: records in, text out. They read only records (never thunder), so a dump renders anywhere."""
