"""A Thunder trace transform that brackets every fusion region of a thunder split's final forward and backward traces
with calls to an observer: the recorder's fusion-level timing (clock marks, named NVTX / profiler ranges), and
whatever else watches the regions of a split (see `recording.regions`).

The observer is any object with the four methods of `MARK_METHODS`. `begin_trace(phase)` and `end_trace(phase)`
get the phase ("forward", "backward"); `begin_region(key, *inputs)` gets the region key ("nvFusion0_forward") and
the values the region is called with, `end_region(key, *outputs)` the key and the values it returned (the run's own
tensors: no copy is made, and an observer must not keep them beyond what it needs). An observer whose
`observes_values` is False (the timer) gets the key alone: every call of the trace makes these calls, and packing a
region's values into them costs a tuple per call.

With `mark_ops`, the observer also gets `mark_op(symbol, executor)` right before every other bound symbol that does
work (`is_op`: not a fusion, not Thunder's bookkeeping (`thunder.dev_utils.utils.NON_COMPUTATION_PRIMS`, the list
Thunder's own NVTX transform skips, and `shallow_copy`), not a view): "linear", "torch". One mark per op, not two:
the time from an op's mark to the next mark is the op's, with the views and dels that follow it, so the marks of a
trace chain its time without gaps and cost one call per op on every run.

Checked against lightning-thunder 0.2.6. What it relies on:

- `Transform.transform_trace_post_optimization` runs on the final forward trace and then on the final backward trace
  of every cache entry Thunder builds (thunder/__init__.py, `apply_transforms_and_build_cache_entry`), after fusion,
  rematerialisation and `del_last_used`. Inserting calls there leaves every fusion decision untouched, so results
  are bit-identical (`dev_utils/nvtx_profile_transform.py` works the same way). The backward trace is the one whose
  signature is `backward_fn` (thunder/transforms/autodiff.py).
- Thunder iterates the very list object that `thunder.compile_data(module).transforms` holds, so appending to it
  before the module's first call (ThunderFX modules compile lazily, on their first call) adds a transform to it.
  That list is shared: by all splits of a graph (they are compiled by one `partial(jit, **thunder_options)`), and,
  when the user passed `transforms=[...]`, by all graphs (0.2.6's `_with_prologue_pruning_transform` appends to
  it). So one `FusionTimingTransform` is appended per list, and it finds the split a trace belongs to through the
  compile data that Thunder makes current while it builds a cache entry (`get_compile_data()`).
- Each inserted call is a bound symbol of an operator of our own executor, with a per-split `_call_ctx` that binds
  its name to the method of the split's observer (the way fusion executors bind their compiled callables). The
  calls around a region stand right before and after it, where Thunder's `del` statements (placed after each
  value's last use) have not freed its inputs and outputs yet.

What the calls record, when and how is the observer's business; nothing here runs on the training path except the
generated calls.
"""

from __future__ import annotations

import weakref
from typing import Any

from thunder.core.compile_data import get_compile_data
from thunder.core.prims import OpTags, PrimIDs
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace
from thunder.core.transform_common import Transform
from thunder.dev_utils.utils import NON_COMPUTATION_PRIMS
from thunder.extend import OperatorExecutor

from thunderfx_debug.records import Phase

_timing_ex = OperatorExecutor("thunderfx_debug_timing")


def _no_output(label: str, *values) -> None:
    return None


# The operators of the inserted calls, named after the observer methods they call.
MARK_METHODS = ("begin_trace", "begin_region", "end_region", "end_trace")
OP_METHOD = "mark_op"
_MARK_OPS = {
    method: _timing_ex.register_operator(f"thunderfx_debug_{method}", meta=_no_output)
    for method in (*MARK_METHODS, OP_METHOD)
}
_MARK_NAMES = frozenset(op.name for op in _MARK_OPS.values())
_PROVENANCE = "thunderfx_debug fusion timing marks"

#: Bound symbols that launch no work of their own: Thunder's list (unpacking, checks, del, return...) and a view copy.
_BOOKKEEPING_IDS = frozenset(NON_COMPUTATION_PRIMS) | {PrimIDs.SHALLOW_COPY}
_BOOKKEEPING_NAMES = frozenset({"clear_mutable_collection", "shallow_copy"})
#: Executor ops that change only a tensor's metadata (a view, no kernel); a copy one of them may make (reshape of a
#: non-contiguous tensor) counts with the op before it.
VIEW_NAMES = frozenset({
    "unsqueeze", "squeeze", "expand", "permute", "transpose", "view", "reshape", "split", "broadcast_in_dim",
    "torch_prims_reshape_impl", "torch_prims_transpose_impl", "slice_prim", "getitem", "torch_prims_view_impl",
    "real_view", "flatten", "unflatten", "chunk", "movedim", "t", "narrow", "unbind", "as_strided", "detach",
})


def is_op(bsym) -> bool:
    """A bound symbol of a final trace that does work outside fusion regions (see the module docstring)."""
    sym = bsym.sym
    if sym.is_fusion or sym.name in _MARK_NAMES or sym.id in _BOOKKEEPING_IDS or sym.name in _BOOKKEEPING_NAMES:
        return False
    return sym.name not in VIEW_NAMES and OpTags.SHAPE_OP not in (getattr(sym, "tags", None) or ())


def op_executor(bsym) -> str:
    """The name of the executor that runs a bound symbol ("torch", "sdpa", "cudnn", "python")."""
    return getattr(bsym.sym.executor, "name", None) or "thunder"


def attach(thunder_module, observer, mark_ops: bool = False) -> None:
    """Makes Thunder instrument the traces it builds for `thunder_module` from now on, calling `observer` (and its
    `mark_op` before every op outside the fusion regions, with `mark_ops`)."""
    import thunder

    compile_data = thunder.compile_data(thunder_module)
    stats = thunder.compile_stats(thunder_module)
    if compile_data is None:
        raise RuntimeError(f"{type(thunder_module).__name__} is not a Thunder-compiled module")
    if stats is not None and stats.interpreter_cache:
        raise RuntimeError("the Thunder module was already compiled; an observer must be attached before its first call")
    transforms = compile_data.transforms
    transform = next((t for t in transforms if isinstance(t, FusionTimingTransform)), None)
    if transform is None:
        transform = FusionTimingTransform()
        transforms.append(transform)  # last: after every other transform of the user's, on the final traces
    transform.observers[compile_data] = (observer, mark_ops)


class FusionTimingTransform(Transform):
    """Brackets the fusion regions of the final traces of the modules registered in `observers` (keyed by their
    compile data, with whether to mark ops); traces of other modules sharing the transform list pass unchanged."""

    def __init__(self):
        self.observers: weakref.WeakKeyDictionary[Any, tuple[Any, bool]] = weakref.WeakKeyDictionary()

    def transform_trace_post_optimization(self, computation_trace: TraceCtx, **kwargs) -> TraceCtx:
        registered = self.observers.get(get_compile_data())
        if registered is None:
            return computation_trace
        observer, mark_ops = registered
        return instrument_trace(computation_trace, observer, mark_ops)


def trace_phase(trace: TraceCtx) -> Phase:
    """Forward or backward: Thunder names the backward trace's function `backward_fn`."""
    return Phase.BACKWARD if trace.siginfo().name == "backward_fn" else Phase.FORWARD


def instrument_trace(trace: TraceCtx, observer, mark_ops: bool = False) -> TraceCtx:
    """A copy of `trace` with calls to `observer` at its start, before and after every fusion region, before every
    other op (with `mark_ops`), and before its return. The region keys are "<fusion name>_<phase>"
    ("nvFusion0_forward", "TorchCompile1_backward")."""
    phase = trace_phase(trace).value

    def mark(method: str, label: str, values=()):
        op = _MARK_OPS[method]
        # Built directly: `bind` and `from_bsym` would reset the call ctx to the operator's registered one (none).
        return BoundSymbol(op, args=(label, *values), kwargs={}, output=None,
                           _call_ctx={op.name: getattr(observer, method)})

    with_values = getattr(observer, "observes_values", True)
    body = list(trace.bound_symbols)
    return_index = next(
        (i for i in range(len(body) - 1, -1, -1) if body[i].sym.id == PrimIDs.RETURN), len(body)
    )
    instrumented = [mark("begin_trace", phase)]
    for bsym in body[:return_index]:
        if bsym.sym.is_fusion:
            key = f"{bsym.sym.name}_{phase}"
            inputs, outputs = (bsym.flat_args, bsym.flat_outs) if with_values else ((), ())
            instrumented += [mark("begin_region", key, inputs), bsym, mark("end_region", key, outputs)]
        elif mark_ops and is_op(bsym):
            instrumented += [mark(OP_METHOD, bsym.sym.name, (op_executor(bsym),)), bsym]
        else:
            instrumented.append(bsym)
    instrumented += [mark("end_trace", phase), *body[return_index:]]

    new_trace = from_trace(trace)
    new_trace.bound_symbols = instrumented
    new_trace.set_provenance(TraceProvenance(_PROVENANCE))
    new_trace._thunderfx_debug_uninstrumented = trace  # what the records show (see `without_marks`)
    return new_trace


def is_mark(bsym) -> bool:
    return bsym.sym.name in _MARK_NAMES


def without_marks(trace: TraceCtx | None) -> TraceCtx | None:
    """The trace as Thunder built it, without the timing calls: the trace this transform started from, or, for a
    trace Thunder derived from an instrumented one (the forward of a no-grad call is unwrapped afterwards), a copy
    with the calls removed."""
    if trace is None:
        return None
    source = getattr(trace, "_thunderfx_debug_uninstrumented", None)
    if source is not None:
        return source
    if not any(is_mark(b) for b in trace.bound_symbols):
        return trace
    stripped = getattr(trace, "_thunderfx_debug_stripped", None)  # the same copy for the same trace, every flush
    if stripped is None:
        stripped = from_trace(trace)
        stripped.bound_symbols = [b for b in trace.bound_symbols if not is_mark(b)]
        stripped.set_provenance(TraceProvenance(f"{trace.get_provenance()} (the timing calls removed)"))
        trace._thunderfx_debug_stripped = stripped
    return stripped
