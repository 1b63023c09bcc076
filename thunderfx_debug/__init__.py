"""thunderfx_debug: a torch.compile backend that runs ThunderFX and reports what it did, from the real training run.

    from thunderfx_debug import ReportingBackend
    backend = ReportingBackend()                 # the same options as thunder.dynamo.ThunderCompiler
    model = torch.compile(model, backend=backend)
    ...train...                                  # THUNDERFX_DEBUG_DIR=... decides what lands on disk
    print(backend.report())

`import thunderfx_debug` imports neither torch nor thunder (so `load_report` works on a laptop). It installs the one
workaround that `import thunder` itself needs on the installed torch (`thunder.workarounds`) and changes nothing else
of Thunder; so it must come before `import thunder` (it raises ThunderImportOrderError, saying so, where an earlier
`import thunder` failed for want of it).
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from thunderfx_debug.settings.config import ConfigError
from thunderfx_debug.dump.files import load_report, load_reports
from thunderfx_debug.records import DumpError
from thunderfx_debug.render.report import Report
from thunderfx_debug.thunder.import_order import ThunderImportOrderError, check_import_order, import_checked
from thunderfx_debug.thunder.workarounds import install_import_workaround

check_import_order()  # a Thunder half-imported before us: say what to do, instead of failing later and obscurely
install_import_workaround()

try:  # the one source of the version is pyproject.toml, read back from the installed package's metadata
    __version__ = importlib.metadata.version("thunderfx-debug")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
__all__ = ["ReportingBackend", "Report", "load_report", "load_reports", "ConfigError", "DumpError",
           "ThunderImportOrderError", "plain_thunder_compiler", "__version__"]

if TYPE_CHECKING:
    from thunderfx_debug.run.backend import ReportingBackend
    from thunderfx_debug.thunder.compile import plain_thunder_compiler


def _reporting_backend():
    from thunderfx_debug.run.backend import ReportingBackend

    return ReportingBackend


def _plain_thunder_compiler():
    from thunderfx_debug.thunder.compile import plain_thunder_compiler

    return plain_thunder_compiler


def __getattr__(name: str):
    # ReportingBackend imports thunder; loaded on first use only. plain_thunder_compiler: the baseline that
    # benchmarks compare ReportingBackend with (ThunderCompiler as Thunder ships it, with the one workaround it needs).
    if name == "ReportingBackend":
        return import_checked("thunderfx_debug.ReportingBackend", _reporting_backend)
    if name == "plain_thunder_compiler":
        return import_checked("thunderfx_debug.plain_thunder_compiler", _plain_thunder_compiler)
    raise AttributeError(f"module 'thunderfx_debug' has no attribute {name!r}")
