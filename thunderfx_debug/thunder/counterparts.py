"""What the flush-time triage times (see `thunderfx_debug.triage.at_flush`): the callables the run already compiled (a
thunder split's ThunderModule, a fusion region's compiled callable), and their counterparts compiled by inductor.

Whether a split would run its cached code on given inputs is Thunder's prologue's to say: Thunder 0.2.6
(thunder/__init__.py, `get_computation_and_inputs`) fills the call's cache info (default dtype and device, autocast,
grad mode, which plain tensors share a storage: `alias_tensor_indices`) and runs each cache entry's prologue, whose
checks (shapes, dtypes, devices, requires_grad, numbers it specialised on, the cache info) raise on a mismatch; the
first entry whose prologue passes runs, and where none does Thunder compiles again. `refusal` does the same without
compiling.

A fusion region's callable is the one Thunder's final trace calls: Thunder executes a trace's Python with the trace's
`python_ctx()` as its globals, so the object under the region's name in the fusion bound symbol's `_call_ctx` is
what the run called (nvFuser's FusionDefinitionWrapper, or the torch.compile executor's compiled function).
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.thunder.scripts import region_torch_function
from thunderfx_debug.thunder.workarounds import exec_as_source_file

_sources = itertools.count()


def compile_marks(compiled: Callable | None, regions: Sequence[Any] = ()) -> tuple[int | None, int, int]:
    """What grows when a piece compiles again for other inputs: Thunder's cache misses of `compiled` (a split), the
    nvFuser definitions the wrappers of `regions` (`traces.FusionRegion`) built for input layouts they had not seen
    (each FusionDefinitionWrapper looks its definition up in an lru_cache keyed by the inputs' descriptors), and
    Dynamo's recompiles in this process (a torch.compile executor region whose guards failed compiles again, under
    a compile id whose attempt is above 0). Compare two readings taken around a call."""
    definitions = 0
    for region in regions:
        info = getattr(region_callable_or_none(region), "cache_info", None)
        if callable(info):
            definitions += int(info().misses)
    return (cache_misses(compiled) if compiled is not None else None, definitions, dynamo_recompiles())


def dynamo_recompiles() -> int:
    """Dynamo's compiles so far of frames it had compiled before (`compile_events.SPANS`: its callbacks are installed
    by every backend call)."""
    from thunderfx_debug.thunder.compile_events import SPANS

    return sum(1 for span in list(SPANS.spans) if span.trigger == "DYNAMO" and _attempt(span.compile_id) > 0)


def _attempt(compile_id: str) -> int:
    """The attempt of a Dynamo compile id ("3/1": frame 3, its second compile; "!0/3/1" under compiled autograd)."""
    try:
        return int(compile_id.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return 0


def cache_misses(compiled: Callable) -> int | None:
    """How often Thunder compiled the split (a triage call that compiled it again would show here)."""
    import thunder

    try:
        return int(thunder.compile_stats(compiled).cache_misses)
    except Exception:  # not a Thunder callable, or one that has not run
        return None


def refusal(compiled: Callable, args: Sequence[Any]) -> str | None:
    """None where one of Thunder's cached entries of `compiled` (a ThunderModule) accepts `args` in the grad mode and
    autocast state in force; else why the first entry refuses them: the prologue's check that failed and its message,
    e.g. `check_string_value(cache_info_alias_tensor_indices, '0,6'): Expected '' to be equal to '0,6'` (the run
    passed inputs 0 and 6 as views of one storage). Runs the prologues only (see the module docstring)."""
    import thunder
    from thunder.core.compile_data import compile_data_and_stats

    cd, cs = thunder.compile_data(compiled), thunder.compile_stats(compiled)
    entries = list(cs.interpreter_cache)
    if not entries:
        return "Thunder holds no compiled entry for it"
    # populate_cache_info records the grad mode on the compile data and pushes autocast onto its stack, as a real
    # call does; both are put back as they were.
    autocast, grad = list(cd.autocast_stack.stack), cd.is_grad_enabled

    @thunder._with_cache_info_ctx
    def first_refusal() -> str | None:
        cd.populate_cache_info(thunder._get_cache_info(), *args)
        reasons = []
        for entry in entries:
            try:
                with compile_data_and_stats(cd, cs):
                    entry.prologue_fn(*args)
                return None
            except Exception as e:
                reasons.append(_failed_check(e))
        return reasons[0]

    try:
        return first_refusal()
    finally:
        cd.autocast_stack.stack.clear()
        cd.autocast_stack.stack.extend(autocast)
        cd.is_grad_enabled = grad


def _failed_check(error: Exception) -> str:
    """The prologue's line that raised (Thunder names the file of a prologue `thunder.prologue_N`) and the message."""
    lines = [frame.line for frame in traceback.extract_tb(error.__traceback__)
             if frame.filename.startswith("thunder.prologue") and frame.line]
    message = f"{type(error).__name__}: {error}"
    return f"{lines[-1]}: {message}" if lines else message


def region_callable(region) -> Callable:
    """The compiled callable the run calls for `region` (a `traces.FusionRegion`)."""
    fn = region_callable_or_none(region)
    if fn is None:
        raise LookupError(f"Thunder's trace holds no callable for {region.name}")
    return fn


def region_callable_or_none(region) -> Callable | None:
    ctx = getattr(region.bsym, "_call_ctx", None) or {}
    return ctx.get(region.name)


def inductor_region(region) -> Callable:
    """`region`'s ops as torch calls (Thunder's own lowering to its torch executor), compiled by torch.compile with
    fullgraph=True: what inductor makes of the same region. Compiled lazily, at its first call."""
    name = f"{region.name}_{region.phase.value}"
    source, ctx = region_torch_function(region.bsym, name, draws="torch")  # timed, not compared
    namespace: dict[str, Any] = dict(ctx)
    # A file name of its own: regions of different splits share names, and linecache holds one source per name.
    exec_as_source_file(source, f"<{name} as torch calls #{next(_sources)}>", namespace)
    return torch.compile(namespace[name], fullgraph=True)
