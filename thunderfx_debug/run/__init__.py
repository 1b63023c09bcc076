"""The run: `backend.ReportingBackend`, the torch.compile entry point that wraps ThunderFX and hands each graph to
the recorder; `flusher`, which writes its dump (now, periodically from a writer thread, at exit) after the
flush-time work has run; and `sigterm`, the flush on SIGTERM that keeps the handler installed before. The package's
`__init__` re-exports `ReportingBackend` from here."""
