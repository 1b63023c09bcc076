"""`import thunderfx_debug` must come before `import thunder` where Thunder needs the import workaround
(`workarounds.needs_named_tensor_placeholders`: Thunder 0.2.6 on torch 2.13). Where it did not, this says so.

What a wrong order leaves behind: `import thunder` fails with "type object 'Tensor' has no attribute 'align_as'";
Python then drops `thunder` from sys.modules but keeps the submodules that had finished loading (thunder.core.*,
thunder.clang, ...). Importing Thunder again in the same process cannot succeed (its optree registrations are
already made), and the package's lazy `ReportingBackend` would otherwise fail with Python's bare "cannot import name
'ReportingBackend'". Imports neither torch nor thunder.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import warnings
from collections.abc import Callable
from typing import TypeVar

from thunderfx_debug.thunder.workarounds import needs_named_tensor_placeholders

T = TypeVar("T")


class ThunderImportOrderError(ImportError):
    """Thunder was half-imported before thunderfx_debug; the message says what to do."""


def half_imported_thunder_modules(modules: dict | None = None) -> list[str]:
    """Submodules of a Thunder whose own `import thunder` failed: present while `thunder` itself is absent.

    Example:
        >>> half_imported_thunder_modules({"thunder.core": None, "torch": None})
        ['thunder.core']
        >>> half_imported_thunder_modules({"thunder": None, "thunder.core": None})
        []
    """
    modules = sys.modules if modules is None else modules
    if "thunder" in modules:
        return []
    return sorted(name for name in modules if name.startswith("thunder."))


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def import_order_message(modules: list[str], cause: BaseException | None = None) -> str:
    what = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    text = (f"thunderfx_debug: an earlier `import thunder` failed{what} and left Thunder half-loaded in this process "
            f"({len(modules)} of its modules, such as {modules[0]}, but not `thunder` itself). ")
    if needs_named_tensor_placeholders():
        text += (f"Thunder {_version('lightning-thunder')} imports on torch {_version('torch')} only after "
                 "`import thunderfx_debug`, which installs the workaround it needs (lightning-thunder#2829). Put "
                 "`import thunderfx_debug` first, before `import thunder` and before anything that imports Thunder, ")
    else:
        text += "Run `python -c 'import thunder'` to see why it failed and fix that, "
    return text + "then restart the interpreter (or notebook kernel): a failed import of Thunder cannot be undone."


def check_import_order() -> None:
    """Raises ThunderImportOrderError where an `import thunder` failed earlier in this process (a scan of
    sys.modules: cheap)."""
    modules = half_imported_thunder_modules()
    if modules:
        raise ThunderImportOrderError(import_order_message(modules))


TRANSFORMER_ENGINE_MISSING = "transformer_engine module not found!"


def import_checked(what: str, load: Callable[[], T]) -> T:
    """`load()`, an import that imports Thunder (the package's lazy `ReportingBackend`, whose import `what` names),
    after `check_import_order`. An AttributeError while importing (a half-imported Thunder: "partially initialized
    module 'thunder' has no attribute 'core'") becomes an ImportError that says so: raised from a module
    `__getattr__`, Python would report it as "cannot import name" without its cause."""
    check_import_order()
    try:
        with warnings.catch_warnings():
            # Thunder 0.2.6 warns at import, on every run, where transformer_engine is not installed
            # (thunder/executors/transformer_engineex.py): not news to a user of this package, whose import of
            # Thunder this is. An `import thunder` of the user's own still warns (Thunder is left as it is).
            warnings.filterwarnings("ignore", message=re.escape(TRANSFORMER_ENGINE_MISSING), category=UserWarning)
            return load()
    except AttributeError as e:
        modules = half_imported_thunder_modules()
        if modules:
            raise ThunderImportOrderError(import_order_message(modules, e)) from e
        raise ImportError(f"{what} cannot be imported ({type(e).__name__}: {e})") from e
