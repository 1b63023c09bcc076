"""thunderfx_debug: a torch.compile backend that runs ThunderFX and reports what it did, from the real training run.

    from thunderfx_debug import ReportingBackend
    backend = ReportingBackend()                 # the same options as thunder.dynamo.ThunderCompiler
    model = torch.compile(model, backend=backend)
    ...train...                                  # THUNDERFX_DEBUG_DIR=... decides what lands on disk
    print(backend.report())

`import thunderfx_debug` imports neither torch nor thunder (so `load_report` works on a laptop); it installs the
version workarounds of `thunderfx_debug.compat`, which apply when Thunder is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thunderfx_debug import compat
from thunderfx_debug.config import ConfigError
from thunderfx_debug.dump import load_report, load_reports
from thunderfx_debug.records import DumpError, Report

compat.install()

__version__ = "0.1.0"
__all__ = ["ReportingBackend", "Report", "load_report", "load_reports", "ConfigError", "DumpError", "__version__"]

if TYPE_CHECKING:
    from thunderfx_debug.backend import ReportingBackend


def __getattr__(name: str):
    # ReportingBackend imports thunder; loaded on first use only.
    if name == "ReportingBackend":
        from thunderfx_debug.backend import ReportingBackend

        return ReportingBackend
    raise AttributeError(f"module 'thunderfx_debug' has no attribute {name!r}")
