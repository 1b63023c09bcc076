"""Renderers: records in, text out. They read only records (never thunder), so a dump renders anywhere: the
summary, HTML, diff, traces and the rest, one renderer per artifact; `report.Report`, the records of one rank whose
`str()` is the summary; and `progress`, a bar or log lines for long work (a flush's scripts, `bench`, the demo)."""
