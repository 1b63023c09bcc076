"""What the flush-time triage times (see `thunderfx_debug.triage`): the callables the run already compiled (a thunder
split's ThunderModule, a fusion region's compiled callable), and their counterparts compiled by inductor.

A fusion region's callable is the one Thunder's final trace calls: Thunder executes a trace's Python with the trace's
`python_ctx()` as its globals, so the object under the region's name in the fusion bound symbol's `_call_ctx` is
what the run called (nvFuser's FusionDefinitionWrapper, or the torch.compile executor's compiled function).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from thunderfx_debug.thunder.scripts import region_torch_function
from thunderfx_debug.thunder.workarounds import exec_as_source_file

_sources = itertools.count()


def cache_misses(compiled: Callable) -> int | None:
    """How often Thunder compiled the split (a triage call that compiled it again would show here)."""
    import thunder

    try:
        return int(thunder.compile_stats(compiled).cache_misses)
    except Exception:  # not a Thunder callable, or one that has not run
        return None


def region_callable(region) -> Callable:
    """The compiled callable the run calls for `region` (a `traces.FusionRegion`)."""
    ctx = getattr(region.bsym, "_call_ctx", None) or {}
    fn = ctx.get(region.name)
    if fn is None:
        raise LookupError(f"Thunder's trace holds no callable for {region.name}")
    return fn


def inductor_region(region) -> Callable:
    """`region`'s ops as torch calls (Thunder's own lowering to its torch executor), compiled by torch.compile with
    fullgraph=True: what inductor makes of the same region. Compiled lazily, at its first call."""
    name = f"{region.name}_{region.phase.value}"
    source, ctx = region_torch_function(region.bsym, name)
    namespace: dict[str, Any] = dict(ctx)
    # A file name of its own: regions of different splits share names, and linecache holds one source per name.
    exec_as_source_file(source, f"<{name} as torch calls #{next(_sources)}>", namespace)
    return torch.compile(namespace[name], fullgraph=True)
