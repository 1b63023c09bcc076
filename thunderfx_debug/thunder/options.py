"""Thunder options and executors, by name: for the manifest, and for the repro scripts, which name the run's
executors."""

from __future__ import annotations

import difflib
import functools
import inspect
import re
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
