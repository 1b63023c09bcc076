"""What a piece received and returned on its first call, kept for its repro scripts: the metadata of every input (and,
with THUNDERFX_DEBUG_INPUTS=real, host copies of the inputs and outputs themselves).

For graphs and splits the runners capture on the first call; for fusion regions a region observer does
(`RegionCapture`, called by the split's instrumented traces, see `recording.regions`), on the first call of each
region. Nothing here waits for the device:
- metadata is read from the tensors' Python objects (shape, strides, storage offset and size, dtype, device,
  requires_grad) and Python values are kept as they were (numbers, such as the philox seed and offset that Thunder's
  traces carry as IntegerProxy(None), dtypes, devices, None);
- what the values were (range; for integers the smallest non-negative value and a single negative sentinel with its
  frequency; for bools and 0/1 masks the fraction that is True) is reduced on the device into a few numbers, read at
  flush (`Captured.metas(wait=True)`);
- real copies go to pinned host memory with `non_blocking` (copies on the same stream are ordered before any later
  in-place update, e.g. the optimizer's) and are read at flush, after the recorder waited for the device.
Integer and bool tensors are copied so whenever the values are read (`Captured.integers`, within
RUN_INTEGERS_MAX_BYTES per piece), also without THUNDERFX_DEBUG_INPUTS=real: they index, select and mask (embedding
rows, relative-position buckets, expert ids, a permutation, where a mask is False), and no value drawn within their
range keeps what they index or how they relate to each other.
Beyond THUNDERFX_DEBUG_INPUTS_MAX_MB (per piece: a graph, a split, a fusion region; inputs and outputs together) no
copy is kept and the scripts make inputs from the metadata, saying so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import InputKind, InputMeta, storage_span
from thunderfx_debug.scripts import device_timer
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.splits import sequence_of_numbers

#: Version of the saved inputs file (format 2 keeps storage offsets and sizes, dtypes and devices).
INPUTS_FORMAT = 2

#: Bytes of integer and bool inputs kept as the run had them, per piece (see the module docstring).
RUN_INTEGERS_MAX_BYTES = 16 * 2**20


# ---- metadata and value statistics ----------------------------------------------------------------------------------


def _storage_size(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except Exception:  # tensors without a storage (some subclasses, functional wrappers)
        return None


def value_meta(value: Any) -> InputMeta:
    """The metadata of one value a piece received (no statistics; no device access)."""
    if isinstance(value, torch.Tensor):
        t = value.data if isinstance(value, torch.nn.Parameter) else value
        return InputMeta(
            kind=InputKind.TENSOR,
            shape=tuple(int(s) for s in t.shape),
            stride=tuple(int(s) for s in t.stride()),
            storage_offset=int(t.storage_offset()),
            storage_size=_storage_size(t),
            dtype=str(t.dtype),
            device=str(t.device),
            requires_grad=bool(value.requires_grad),
            parameter=isinstance(value, torch.nn.Parameter),
        )
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return InputMeta(kind=InputKind.SYMINT, value=value.node.hint)
    if isinstance(value, bool | int | float):
        return InputMeta(kind=InputKind(type(value).__name__), value=value)
    if isinstance(value, complex):
        return InputMeta(kind=InputKind.COMPLEX, value=[value.real, value.imag])
    if value is None:
        return InputMeta(kind=InputKind.NONE)
    if isinstance(value, torch.dtype):
        return InputMeta(kind=InputKind.DTYPE, value=str(value))
    if isinstance(value, torch.device):
        return InputMeta(kind=InputKind.DEVICE, value=str(value))
    numbers = sequence_of_numbers(value)
    if numbers is not None:
        return InputMeta(kind=InputKind.SIZE if isinstance(value, torch.Size) else InputKind.TUPLE, value=numbers)
    return InputMeta(kind=InputKind.OTHER, value=repr(value)[:200])


_INT64_MAX = torch.iinfo(torch.int64).max


def _statistics(t: torch.Tensor) -> torch.Tensor | None:
    """A few numbers about the values of `t`, reduced on its device (queued, not waited for); see `_apply`."""
    if t.numel() == 0 or t.is_complex() or t.layout is not torch.strided or t.device.type == "meta":
        return None
    t = t.detach()
    if t.dtype is torch.bool:
        return t.sum(dtype=torch.float64).div(t.numel()).reshape(1)
    if t.dtype.is_floating_point:
        wide = t if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else t.float()
        low, high = torch.aminmax(wide)
        return torch.stack([low.double(), high.double()])
    wide = t.long()
    negative = wide < 0
    return torch.stack([
        wide.min(), wide.max(),
        torch.where(negative, _INT64_MAX, wide).min(),  # smallest value >= 0 (INT64_MAX: none)
        torch.where(negative, wide, 0).min(), torch.where(negative, wide, -_INT64_MAX).max(),  # negative range
        negative.sum(), (wide != 0).sum(),
    ])


def _apply(meta: InputMeta, numbers: list[float | int]) -> InputMeta:
    """`meta` with the statistics `_statistics` reduced, read back as Python numbers."""
    numel = 1
    for size in meta.shape:
        numel *= size
    if meta.dtype == "torch.bool":
        fraction = float(numbers[0])
        value = bool(fraction >= 1.0) if not meta.shape else None
        return dataclasses.replace(meta, true_fraction=fraction, min_value=fraction >= 1.0, max_value=fraction > 0.0,
                                   value=value)
    if len(numbers) == 2:
        low, high = float(numbers[0]), float(numbers[1])
        value = low if not meta.shape else None
        if not (math.isfinite(low) and math.isfinite(high)):  # NaN or infinities: no range to draw from
            return dataclasses.replace(meta, value=value)
        return dataclasses.replace(meta, min_value=low, max_value=high, value=value)
    low, high, nonnegative, negative_low, negative_high, negatives, nonzero = (int(n) for n in numbers)
    changes: dict[str, Any] = {"min_value": low, "max_value": high}
    if not meta.shape:
        changes["value"] = low
    if nonnegative != _INT64_MAX:
        changes["nonnegative_min"] = nonnegative
    if negatives and negative_low == negative_high:
        changes["sentinel"], changes["sentinel_fraction"] = negative_low, negatives / numel
    if 0 <= low and high <= 1:
        changes["true_fraction"] = nonzero / numel
    return dataclasses.replace(meta, **changes)


@dataclasses.dataclass
class Captured:
    """What a piece received and returned on its first call (see the module docstring).

    `observed`: metadata per input, with `pending` statistics (device tensors) to read at flush. `inputs`/`outputs`:
    host copies (see `host_copy`) or Python values, with real inputs only; `skipped` says why none were kept
    (over the cap, a value that cannot be saved), and then `inputs` is None."""

    observed: list[InputMeta] = dataclasses.field(default_factory=list)
    pending: list[torch.Tensor | None] = dataclasses.field(default_factory=list)
    ready: Any = None  # a CUDA event recorded after the statistics, or None
    inputs: list[Any] | None = None
    outputs: list[Any] | None = None
    nbytes: int = 0
    max_mb: float = 0.0
    skipped: str | None = None
    # input index -> weak reference to the tensor passed there (kept for the flush-time triage, which times the piece
    # on the run's own parameters, and on copies of its other tensors, where they are still alive)
    references: dict[int, Any] = dataclasses.field(default_factory=dict)
    # The state the call ran in that compiled code depends on (Thunder's cache checks both): grad mode, and autocast
    # as (device type, enabled, dtype) per device type (the format of `check.AutocastState`).
    grad_enabled: bool = True
    autocast: tuple[tuple[str, bool, torch.dtype], ...] = ()
    # Per output (the leaves of what the call returned): the layout of the gradient it received in the call's backward,
    # None where it received none; None before that backward ran (noted by `InputCapture.gradients`).
    grad_outputs: list[InputMeta | None] | None = None
    # input index -> host copy (`host_copy`) of an integer or bool tensor input, where the values were read
    integers: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    _resolved: tuple[InputMeta, ...] | None = None

    @property
    def resolved(self) -> bool:
        """Whether the statistics have been read back (`metas`)."""
        return self._resolved is not None

    def metas(self, wait: bool) -> tuple[InputMeta, ...] | None:
        """The inputs' metadata with their statistics; None while they are not computed and `wait` is False."""
        if self._resolved is not None:
            return self._resolved
        if self.ready is not None and not wait and not self.ready.query():
            return None
        metas = []
        for meta, numbers in zip(self.observed, self.pending):
            metas.append(meta if numbers is None else _apply(meta, numbers.tolist()))
        self._resolved = tuple(metas)
        self.pending = []
        return self._resolved


def observe(values: Sequence[Any], statistics: bool = True, references: bool = False) -> Captured:
    """The metadata of `values` (which of them share a storage too) and, with `statistics`, what their values were,
    queued on the device (see the module docstring); with `references`, weak references to the tensors among them.
    Also the grad mode and autocast state the call runs in."""
    captured = Captured(grad_enabled=torch.is_grad_enabled(), autocast=_autocast_now())
    on_cuda = False
    aliases = alias_roots(values)
    for i, value in enumerate(values):
        meta = value_meta(value)
        captured.observed.append(meta if i not in aliases else dataclasses.replace(meta, alias_of=aliases[i]))
        if references and isinstance(value, torch.Tensor):
            captured.references[i] = weakref.ref(value)
        numbers = _statistics(value) if statistics and isinstance(value, torch.Tensor) else None
        captured.pending.append(numbers)
        on_cuda |= numbers is not None and numbers.device.type == "cuda"
    if statistics:
        captured.integers = _integer_copies(values)
    if on_cuda:
        captured.ready = device_timer.mark(timing=False)
    return captured


def _integer_copies(values: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """Host copies of the integer and bool tensors among `values`, in order, while they fit RUN_INTEGERS_MAX_BYTES."""
    copies, total = {}, 0
    for i, value in enumerate(values):
        if (not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex()
                or value.layout is not torch.strided or type(value) is not torch.Tensor or value.device.type == "meta"):
            continue
        total += storage_span(value.shape, value.stride()) * value.element_size()
        if total > RUN_INTEGERS_MAX_BYTES:
            break
        copies[i] = host_copy(value)
    return copies


def alias_roots(values: Sequence[Any]) -> dict[int, int]:
    """input index -> the index of the first input whose storage it shares, for the tensors that share one with an
    earlier input (a view and its base, two views of one tensor). Compiled code may depend on it: Thunder's cache
    checks which of a call's plain tensors share a storage (its `alias_tensor_indices`).

    Example:
        >>> x = torch.arange(4)
        >>> alias_roots([x, torch.ones(2), x[None].expand(2, 4), 3])
        {2: 0}
    """
    first: dict[tuple[str, int], int] = {}
    roots = {}
    for i, value in enumerate(values):
        if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
            continue
        try:
            pointer = value.untyped_storage().data_ptr()
        except Exception:  # tensors without a storage (subclasses, functional wrappers)
            continue
        if pointer == 0:  # an empty storage: nothing shared
            continue
        root = first.setdefault((str(value.device), pointer), i)
        if root != i:
            roots[i] = root
    return roots


def _autocast_now() -> tuple[tuple[str, bool, torch.dtype], ...]:
    device_types = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in device_types)


def agrees(recorded: Sequence[InputMeta], observed: Sequence[InputMeta]) -> bool:
    """Whether a captured call fits a piece's recorded inputs (from its trace or its splitter): as many, tensors where
    tensors are, with the same shapes and dtypes. A piece that Thunder compiled again for other inputs may have been
    captured on a call of another version of it."""
    if len(recorded) != len(observed):
        return False
    for expected, seen in zip(recorded, observed):
        if (expected.kind is InputKind.TENSOR) != (seen.kind is InputKind.TENSOR):
            return False
        if expected.kind is InputKind.TENSOR and (expected.shape != seen.shape or expected.dtype != seen.dtype):
            return False
    return True


def with_recorded_ranges(recorded: Sequence[InputMeta], observed: Sequence[InputMeta]) -> tuple[InputMeta, ...]:
    """`observed` with the value range of `recorded` where the capture read none (statistics off) and the record
    has one (Thunder's splitter reads the range of a graph's example inputs at compile time)."""
    merged = []
    for before, seen in zip(recorded, observed):
        if (seen.kind is InputKind.TENSOR and seen.min_value is None and seen.true_fraction is None
                and before.min_value is not None and before.dtype == seen.dtype):
            seen = dataclasses.replace(seen, min_value=before.min_value, max_value=before.max_value)
        merged.append(seen)
    return tuple(merged)


# ---- real copies ----------------------------------------------------------------------------------------------------


def host_copy(t: torch.Tensor, blocking: bool = False) -> dict[str, Any]:
    """The storage span of `t` copied to the host, with what rebuilds the tensor exactly (strides, expanded ones too,
    storage offset and size). From a CUDA tensor the copy is queued into pinned memory, not waited for, unless
    `blocking`."""
    offset = t.storage_offset()
    flat = t.detach().as_strided((storage_span(t.shape, t.stride()),), (1,), offset)
    if flat.device.type == "cuda" and blocking:
        host = flat.cpu()
    elif flat.device.type == "cuda":
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)  # no synchronisation here; the recorder waits for the device at flush
    else:
        host = flat.clone()
    return {
        "flat": host,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": offset,
        "storage_size": _storage_size(t),
        "device": str(t.device),
        "requires_grad": bool(t.requires_grad),
    }


def _copy_values(values: Iterable[Any], budget: int) -> tuple[list[Any] | None, int, str | None]:
    """Host copies of tensors, Python values as they are; (None, bytes, reason) when they are over `budget` bytes or
    of a kind that cannot be saved."""
    flat = list(values)
    total = 0
    for value in flat:
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided or type(value) not in (torch.Tensor, torch.nn.Parameter):
                return None, total, f"an input of type {type(value).__name__} ({value.layout}) cannot be saved"
            total += storage_span(value.shape, value.stride()) * value.element_size()
        elif not (isinstance(value, bool | int | float | complex | type(None) | torch.dtype | torch.device
                             | torch.SymInt | torch.SymFloat | torch.SymBool)
                  or sequence_of_numbers(value) is not None):
            return None, total, f"an input of type {type(value).__name__} cannot be saved"
    if total > budget:
        return None, total, f"{total / 2**20:.1f} MB is over THUNDERFX_DEBUG_INPUTS_MAX_MB"
    copies = []
    for value in flat:
        if isinstance(value, torch.Tensor):
            copies.append(host_copy(value))
        elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            copies.append(value.node.hint)
        elif isinstance(value, torch.dtype):
            copies.append({"dtype": str(value).removeprefix("torch.")})
        elif isinstance(value, torch.device):
            copies.append({"device": str(value)})
        elif isinstance(value, tuple):
            copies.append({"size" if isinstance(value, torch.Size) else "tuple": sequence_of_numbers(value)})
        else:
            copies.append(value)
    return copies, total, None


def _add_inputs(captured: Captured, args: Sequence[Any], max_mb: float) -> None:
    copies, nbytes, skipped = _copy_values(args, int(max_mb * 2**20))
    captured.inputs, captured.nbytes, captured.max_mb, captured.skipped = copies, nbytes, max_mb, skipped


def _add_outputs(captured: Captured | None, outputs: Any) -> None:
    if captured is None or captured.inputs is None:
        return
    budget = int(captured.max_mb * 2**20) - captured.nbytes
    copies, nbytes, _ = _copy_values(tree_leaves(outputs), budget)
    captured.outputs = copies
    if copies is not None:
        captured.nbytes += nbytes


def _note_gradient(captured: Captured, index: int, outputs: int, gradient: torch.Tensor) -> None:
    if captured.grad_outputs is None:
        captured.grad_outputs = [None] * outputs
    captured.grad_outputs[index] = value_meta(gradient)


class InputCapture:
    """Captures the first call of graphs and splits into their state's `captured`: always the metadata (what the
    values were too, with `statistics`: the run asks for repro scripts), and with `real` host copies of the inputs
    and outputs within `max_mb` each. A failure is logged (`failures`) and loses what was being captured of that
    piece only."""

    def __init__(self, real: bool, max_mb: float, failures: ReportingFailures, statistics: bool = True,
                 references: bool = False):
        self.real, self.max_mb, self.failures, self.statistics = real, max_mb, failures, statistics
        self.references = references  # keep weak references to tensor inputs (the triage's)

    def inputs(self, state, args) -> None:
        """`state`: a `GraphState` or `SplitState` (anything with `name` and `captured`)."""
        with self.failures.guard(f"capturing the inputs of {state.name}"):
            captured = observe(args, self.statistics, self.references)
            if self.real:
                _add_inputs(captured, args, self.max_mb)
            state.captured = captured

    def call(self, where: str, args) -> Captured | None:
        """The inputs of one call of `where` as `inputs` keeps a piece's first (on the failure path: the call that
        raised), always with what their values were; None where that failed (logged)."""
        with self.failures.guard(f"capturing the inputs of the failing call of {where}"):
            captured = observe(args, statistics=True)
            if self.real:
                _add_inputs(captured, args, self.max_mb)
            return captured
        return None

    def outputs(self, state, outputs) -> None:
        if not self.real:
            return
        with self.failures.guard(f"capturing the first outputs of {state.name}"):
            _add_outputs(state.captured, outputs)

    def gradients(self, state, outputs) -> None:
        """With `references` (the triage's), notes the layout of the gradient each output of the first call receives
        in its backward, by a hook on the output that fires with that backward only (the tensor is the first call's):
        the torch.compile executor's backward regions guard on the strides of the gradients they get (a loss's
        `.sum()` hands on an expanded one), and the triage's backward then gets gradients laid out the same."""
        captured = state.captured
        if not self.references or captured is None:
            return
        with self.failures.guard(f"noting the gradients of {state.name}'s first call"):
            leaves = tree_leaves(outputs)
            captured.grad_outputs = None
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    leaf.register_hook(functools.partial(_note_gradient, captured, i, len(leaves)))


class RegionCapture:
    """A region observer (see `recording.regions`) of one thunder split: on the first call of each fusion region, the
    metadata of its inputs as the run passed them, and with `real` host copies of its inputs and outputs within
    `max_mb` per region. Later calls cost a dictionary lookup per region.

    `captures` maps region keys ("nvFusion0_forward") to what was captured."""

    def __init__(self, label: str, real: bool, max_mb: float, failures: ReportingFailures, references: bool = False):
        self.label, self.real, self.max_mb, self.failures = label, real, max_mb, failures
        self.references = references
        self.captures: dict[str, Captured] = {}
        self._awaiting_outputs: str | None = None

    def begin_trace(self, phase: str) -> None:
        pass

    def begin_region(self, key: str, *inputs) -> None:
        if key in self.captures:
            return
        with self.failures.guard(f"capturing the inputs of {self.label}/{key}"):
            captured = observe(inputs, references=self.references)
            if self.real:
                _add_inputs(captured, inputs, self.max_mb)
            self.captures[key] = captured
            self._awaiting_outputs = key

    def end_region(self, key: str, *outputs) -> None:
        if key != self._awaiting_outputs:
            return
        self._awaiting_outputs = None
        with self.failures.guard(f"capturing the outputs of {self.label}/{key}"):
            _add_outputs(self.captures[key], outputs)

    def end_trace(self, phase: str) -> None:
        pass
