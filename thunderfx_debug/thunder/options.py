"""Thunder options and executors, by name: for the manifest, and for the repro scripts, which name the run's
executors."""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: What `thunder.dynamo.ThunderCompiler.__init__` itself adds to the options it hands `thunder.jit` (Thunder 0.2.6).
THUNDERFX_OWN_OPTIONS = frozenset({"fusion_type", "thunderfx_disable_split_autograd"})


def describe_options(thunder_options: dict[str, Any]) -> dict[str, str]:
    """Thunder options as text for the manifest (executors by name)."""
    from thunder import resolve_executors

    described = {}
    for key, value in thunder_options.items():
        if key == "executors" and value is not None:
            described[key] = repr([ex.name for ex in resolve_executors(value)])
        else:
            described[key] = repr(value)
    return described


def executor_names(thunder_options: dict[str, Any]) -> list[str] | None:
    """The names of the run's executors (None when the run did not pass any: Thunder's defaults)."""
    from thunder import resolve_executors

    value = thunder_options.get("executors")
    return None if value is None else [ex.name for ex in resolve_executors(value)]


def executor_modules(executors: Iterable[Any]) -> dict[str, tuple[str | None, str | None]]:
    """Executor name -> (the module that holds it as a global, the folder of sys.path that module was imported from)
    for the executors not of Thunder's own: what a process other than the run's imports to have them (a repro script,
    a flush-time child). A module that registers its executor on import registers it there too. Where none can be
    imported, (None, why): the training script itself (`__main__`) holds it, or no module does. An executor is
    Thunder's own where a module of Thunder holds it, or, held by none, where its ops were all made by Thunder."""
    wanted = {id(executor): executor for executor in executors}
    holders: dict[int, list[str]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] in ("torch", "thunderfx_debug"):
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        for value in values:
            if id(value) in wanted:
                holders.setdefault(id(value), []).append(name)
    found: dict[str, tuple[str | None, str | None]] = {}
    for key, executor in wanted.items():
        # The module that defines its ops first (others that hold it import that one); the training script,
        # `__main__` (and `__mp_main__` once multiprocessing ran), last: held there only, it cannot be imported.
        defining = _defining_modules(executor)
        names = sorted(holders.get(key, ()), key=lambda n: (n in _MAIN, n not in defining, n))
        if any(n.split(".")[0] == "thunder" for n in names) or (not names and not _made_outside_thunder(executor)):
            continue
        if not names:
            found[executor.name] = (None, "no module of the run held it as a global")
        elif names[0] in _MAIN:
            main = getattr(sys.modules["__main__"], "__file__", None) or "the interpreter's own"
            found[executor.name] = (None, f"the training script itself ({main}) registered it, and no other script "
                                          "can import the training script")
        else:
            found[executor.name] = (names[0], _import_folder(names[0]))
    return found


_MAIN = ("__main__", "__mp_main__")


def run_executor_modules(thunder_options: dict[str, Any]) -> dict[str, tuple[str | None, str | None]]:
    """`executor_modules` of the executors the run's options name (none where they name none: Thunder's defaults)."""
    from thunder import resolve_executors

    value = thunder_options.get("executors")
    return {} if value is None else executor_modules(resolve_executors(value))


def _defining_modules(executor: Any) -> set[str]:
    """The modules the meta functions of an executor's ops come from."""
    found = set()
    for symbol in getattr(executor, "opmap", {}).values():
        module = getattr(getattr(symbol, "meta", None), "__module__", None)
        if isinstance(module, str) and module:
            found.add(module)
    return found


def _made_outside_thunder(executor: Any) -> bool:
    """Whether an executor's ops were made outside Thunder: the meta function of one comes from another module."""
    return any(module.split(".")[0] != "thunder" for module in _defining_modules(executor))


def _import_folder(module_name: str) -> str | None:
    """The folder of sys.path from which `module_name` was imported (None where it has no file)."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path:
        return None
    folder = Path(path).resolve().parent
    if Path(path).name == "__init__.py":
        folder = folder.parent
    for _ in module_name.split(".")[1:]:
        folder = folder.parent
    return str(folder)


def jit_arguments() -> frozenset[str]:
    """The keyword arguments `thunder.jit` names in its signature (executors, transforms, cache, ...)."""
    import thunder

    return frozenset(name for name, p in inspect.signature(thunder.jit).parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)


@functools.cache
def _options_read_in_source() -> frozenset[str]:
    """Compile options Thunder's own code reads by name: `compile_options.get("x")`, `compile_options["x"]`,
    `get_compile_option("x", ...)`. Thunder records in its compile stats only those read through
    get_compile_option (see `thunder.last_compile_options`), and several are read directly from the dict; reading
    the names from its installed source keeps this right for whatever Thunder is installed."""
    import thunder

    pattern = re.compile(r"""(?:compile_options\.get\(|compile_options\[|get_compile_option\()\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
    names: set[str] = set()
    for path in Path(thunder.__file__).parent.rglob("*.py"):
        if "tests" in path.parts:
            continue
        try:
            names.update(pattern.findall(path.read_text(errors="replace")))
        except OSError:
            continue
    return frozenset(names)


def unread_options(options: Mapping[str, Any], compiled: Iterable[Any], known: Iterable[str] = ()) -> dict[str, str | None]:
    """Options passed for Thunder that nothing reads -> the closest name that something does read (None where
    none is close): neither `thunder.jit`'s arguments, nor ThunderFX's own, nor an option Thunder asked for while
    compiling `compiled` (Thunder-jitted functions after their first call), nor one its source reads by name, nor
    `known` (the caller's own options)."""
    import thunder

    candidates = set(options) - jit_arguments() - THUNDERFX_OWN_OPTIONS - set(known)
    if not candidates:
        return {}
    queried: set[str] = set()
    for fn in compiled:
        try:
            queried.update(thunder.compile_stats(fn).last_compile_reasons)
        except Exception:  # not a Thunder function, or not compiled yet: it read nothing
            continue
    read = queried | _options_read_in_source() | jit_arguments() | set(known)
    unread = sorted(candidates - read)
    return {name: next(iter(difflib.get_close_matches(name, sorted(read), n=1, cutoff=0.75)), None) for name in unread}
