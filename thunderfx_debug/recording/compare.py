"""Judging a piece's values against its eager reference on the device: the rule of the correctness sentinel, which the
repro scripts apply too.

A floating-point value passes when its largest error is within rtol * M + atol * min(1, M), M the largest magnitude
of its reference, with its dtype's (rtol, atol); where it does not, it is judged by its own distance to a float64 run
of the same code (`Float64Mode`), which may be that plus three times eager's own largest error against the float64
run, plus one unit of the dtype's precision at the largest magnitude among the values judged with it
(`rounding_floor`): rounding that eager does too (bf16 matmuls, an explicit cast to bf16 inside the piece) is not a
mismatch, nor is the noise of a value that is zero but for rounding. The
floor shrinks with the values below 1, because a fixed one lets any error pass in a tensor of small values (a bf16
model's gradients are ~1e-3, bf16's atol 5e-2). That is the accuracy minifier's idea (`torch._dynamo.utils.same`
with `fp64_ref`), with maxima instead of its RMSE, because a fault that corrupts a few hundred elements of a large
tensor (the H200's nvFuser writing out of bounds) hardly moves an RMSE. Integer and bool values must be equal.

The rule itself (the dtype table, `allowed_error`, `verdict`) and the float64 reference (`Float64Mode`,
`to_float64`) are one block of code that `artifacts/repro/script_template.py` carries as an exact copy, because a
repro script stands alone; `tests/test_check_rule.py` holds the two equal. So a MISMATCH of the sentinel and its
script's "in the run" line are the same judgement.

Two rounds here, each with one device synchronisation for all the values of a piece: first against eager in the
piece's dtypes; only if some value is beyond its tolerance there is the float64 reference made (it costs as much as
the piece's forward or more) and the values judged again. A value within tolerance of eager is within the float64
bound too (|a - f| <= |a - e| + |e - f| <= allowed + 3 |e - f|), so the first round decides every verdict it passes.

`torch._dynamo.utils.same` itself is not called: it answers with a bool (no error, no margin for the record),
synchronises the device per tensor (`.item()`), and logs every failure at error level.

Example (CPU: a float32 value off by 1e-3 of its magnitude, judged against eager alone and then against float64):
    >>> reference = torch.linspace(-1, 1, 5)
    >>> [round(j.ratio, 3) for j in judge(["out 0"], [reference + 1e-3], [reference])]
    [5.0]
    >>> float64 = lambda: [reference.double()]
    >>> judged = judge(["out 0"], [reference + 1e-3], [reference], float64)
    >>> judged[0].reference, round(judged[0].ratio, 3), judged[0].mismatch
    ('float64 eager', 5.0, True)
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

# ---- the judging rule: the same text in recording/compare.py and artifacts/repro/script_template.py ----------------

#: (rtol, atol) by dtype: a compiled piece reorders floating-point work, so results differ by rounding, more with
#: fewer mantissa bits. Integer and bool values must match exactly.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_FLOAT8_TOLERANCE = (0.25, 0.25)
#: Eager's own largest error against float64, times this, is added to what a value may differ by.
NOISE_SLACK = 3.0


def tolerance(dtype):
    """(rtol, atol) for values of `dtype`; (0, 0) for exact types."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)


def allowed_error(rtol, atol, scale):
    """What a value whose reference's largest magnitude is `scale` may differ by, before eager's own noise.

    Example (bfloat16: 5 % of the values' size, atol at full height only for values of 1 and above):
        >>> allowed_error(0.05, 0.05, 10.0), allowed_error(0.05, 0.05, 1e-3)
        (0.55, 0.0001)
    """
    return rtol * scale + atol * min(1.0, scale)


def rounding_floor(dtype, piece_scale):
    """One unit of `dtype`'s precision at the largest magnitude among the values of that dtype judged together
    (`piece_scale`: a piece's outputs, or its gradients): the absolute rounding noise a value computed from such
    values can carry, however small the value itself is. `verdict` allows it only to a value that is mostly noise
    (eager's own error against float64 at least half its magnitude): a gradient that is zero but for rounding (a
    bias before a normalisation: ~1e-13 in float32 beside values ~0.4) is noise to either side, which no multiple
    of eager's own error bounds, while a small value eager computes well keeps its own tolerance."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return 0.0
    return torch.finfo(dtype).eps * piece_scale


def verdict(error, scale, rtol, atol, own=None, noise=None, floor=0.0):
    """(ratio, allowed, against float64): a value's largest `error` against its reference (largest magnitude
    `scale`) as a fraction of what is allowed; above 1 is a mismatch. Where that is above 1 and a float64 run is
    known (`own`: the value's largest error against it, `noise`: the reference's), the value is judged by `own`
    against what is allowed plus NOISE_SLACK times `noise`, plus `floor` (`rounding_floor`) where the reference is
    mostly noise (`noise` at least half of `scale`). Exact types (rtol = atol = 0) allow nothing."""
    if rtol == 0 and atol == 0:
        return (math.inf if error > 0 else 0.0), 0.0, False
    allowed = allowed_error(rtol, atol, scale)
    ratio = error / allowed if allowed > 0 else (math.inf if error > 0 else 0.0)
    if not ratio > 1.0 or own is None or noise is None:
        return ratio, allowed, False
    allowed = allowed + NOISE_SLACK * noise + (floor if 2 * noise >= scale else 0.0)
    return (own / allowed if allowed > 0 else (math.inf if own > 0 else 0.0)), allowed, True


_LOWER_PRECISION_METHODS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})
_LOWER_PRECISION_TYPE_NAMES = frozenset({"FloatTensor", "HalfTensor", "BFloat16Tensor"})
_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.zeros, torch.ones, torch.empty,
                        torch.full, torch.arange, torch.linspace, torch.logspace, torch.eye})
_ENTER_AUTOCAST = getattr(torch.amp.autocast_mode, "_enter_autocast", None)


def _widened(value):
    """A dtype (or legacy tensor type name) an op is asked for, as its float64 (complex128) counterpart."""
    if isinstance(value, torch.dtype):
        if value.is_complex:
            return torch.complex128
        if value.is_floating_point:
            return torch.float64
    if isinstance(value, str) and value.startswith("torch.") and value.rpartition(".")[2] in _LOWER_PRECISION_TYPE_NAMES:
        return value.rpartition(".")[0] + ".DoubleTensor"
    return value


def _wide_result(value):
    if isinstance(value, torch.Tensor):
        if value.is_complex() and value.dtype is not torch.complex128:
            return value.to(torch.complex128)
        if value.is_floating_point() and value.dtype is not torch.float64:
            return value.to(torch.float64)
    return value


class Float64Mode(TorchFunctionMode):
    """Runs torch code in float64, the yardstick for rounding: every conversion to a floating dtype becomes one to
    float64 whatever the source (`x.float()` of an int64 tensor, `x.to(torch.bfloat16)`, `x.type(torch.half)`,
    `dtype=` keywords), factories without a dtype make float64, autocast is off (also where the code enters it),
    and any floating result of lower precision left over is widened. With its inputs in float64 (`to_float64`), an
    FX module or a fusion region's torch function computes in float64 throughout, so that the roundings the code
    asks for (a bf16 cast inside a piece) count as eager's own noise, not as the yardstick's.

    Why not `torch._dynamo.debug_utils.cast_to_fp64`: it rewrites the dtype arguments of aten-level FX graphs
    (`prims.convert_element_type` and `dtype=` keywords) but not the `Tensor.to` / `.float()` method calls of the
    Dynamo graphs ThunderFX splits, and a fusion region's reference is a Python function, not an FX graph.

    Example:
        >>> with Float64Mode():
        ...     torch.ones(2, dtype=torch.bfloat16).dtype, torch.arange(3).float().dtype, torch.zeros(2).dtype
        (torch.float64, torch.float64, torch.float64)
    """

    def __enter__(self):
        self._autocast_off = [torch.autocast(device, enabled=False) for device in ("cpu", "cuda")
                              if torch.is_autocast_enabled(device)]
        for context in self._autocast_off:
            context.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for context in reversed(self._autocast_off):
                context.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LOWER_PRECISION_METHODS:
            return args[0].to(torch.float64) if not args[0].is_complex() else func(*args, **kwargs)
        if func is _ENTER_AUTOCAST:  # torch.autocast(device, dtype, enabled, cache) inside a Dynamo graph
            return func(args[0], args[1], False, *args[3:])
        args, kwargs = tree_map(_widened, (tuple(args), kwargs))
        result = func(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("dtype") is None and isinstance(result, torch.Tensor) \
                and result.is_floating_point() and result.dtype is not torch.float64:
            return func(*args, **{**kwargs, "dtype": torch.float64})  # made as float64, not rounded first
        return tree_map(_wide_result, result)


def to_float64(values, requires_grad=False):
    """Floating-point tensors as float64 copies (complex as complex128; leaves that require grad where
    `requires_grad` and the original did); other values as they are."""
    result = []
    for x in values:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            wide = x.detach().to(torch.complex128 if x.is_complex() else torch.float64)
            result.append(wide.requires_grad_(bool(requires_grad and x.requires_grad)))
        else:
            result.append(x)
    return result


#: Ops whose index outputs pick one of several equal values in an order of their own (torch promises none for topk,
#: sort and argsort unless stable, argmax, argmin, max and min along a dim): a backend may pick another of them.
PICKING_OPS = frozenset({"topk", "sort", "argsort", "argmax", "argmin", "max", "min"})
#: Ops that write their result into their first argument: a value written from a pick depends on it.
_WRITES_FIRST_ARGUMENT = frozenset({"__setitem__", "index_put_", "scatter_", "scatter_add_", "index_copy_",
                                    "index_add_", "masked_scatter_", "copy_"})


class Picks(TorchFunctionMode):
    """Eager run under it, what the ops of `PICKING_OPS` picked: each index tensor they returned with the values it
    picks from, whether they had a choice (values within their dtype's tolerance of each other where the order
    decides: the k-th and the next for top-k, neighbours for a sort, the extreme for argmax), and which tensors
    depend on a pick (computed from an index tensor, or written from one). A value beyond its tolerance is then
    judged by `excuse`: an index output by the values its indices pick, a value that depends on a pick among tied
    values not compared (`tied`), its gradients neither once the forward was seen to pick otherwise (`differed`).

    Example (a tie: eager picks index 0 of two equal values, another backend index 1):
        >>> with Picks() as picks:
        ...     values, indices = torch.topk(torch.tensor([[1.0, 1.0, 0.0]]), 1)
        >>> picks.excuse(torch.tensor([[1]]), indices)
        'its indices pick other of tied values (topk) at 1 of 1 positions; the values they pick match'
    """

    def __init__(self):
        super().__init__()
        self.index_outputs = []  # (index tensor, values it picks from, dim, whether the dim was reduced away, op)
        self.choices = []  # (op, values, dim, k or None: top-k, 0: an extreme, -1: a sort, stable)
        self.differed = []  # what `excuse` excused: the forward picked otherwise than eager
        self._dependent = weakref.WeakValueDictionary()  # id -> tensor computed from a pick

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if any(self.depends(x) for x in tensors):
            written = tree_leaves(args[0]) if name in _WRITES_FIRST_ARGUMENT or name.startswith("__i") else []
            for out in [*tree_leaves(result), *written]:
                if isinstance(out, torch.Tensor):
                    self._dependent[id(out)] = out
        if name in PICKING_OPS and tensors and isinstance(args[0], torch.Tensor):
            self._note(name, args, kwargs, result)
        return result

    def depends(self, value) -> bool:
        return isinstance(value, torch.Tensor) and self._dependent.get(id(value)) is value

    def _note(self, name, args, kwargs, result):
        source = args[0].detach()
        bound = dict(zip(("k", "dim") if name == "topk" else ("dim",), args[1:]), **kwargs)
        dim = bound.get("dim", -1 if name in ("topk", "sort", "argsort") else None)
        if name in ("max", "min") and not isinstance(dim, int):
            return  # the overall extreme, or the elementwise one of two tensors: values, no index
        if dim is None:  # argmax/argmin over all elements: an index into the flattened tensor
            source, dim = source.reshape(-1), 0
        if not isinstance(dim, int) or (name == "topk" and not isinstance(bound.get("k"), int)):
            return
        dim = dim % max(source.dim(), 1)
        indices = result[1] if isinstance(result, tuple) else result
        if not isinstance(indices, torch.Tensor):
            return
        reduced = name in ("argmax", "argmin", "max", "min") and not bound.get("keepdim", False)
        self.index_outputs.append((indices, source, dim, reduced and indices.dim() < source.dim(), name))
        self._dependent[id(indices)] = indices
        order = bound.get("k") if name == "topk" else (-1 if name in ("sort", "argsort") else 0)
        self.choices.append((name, source, dim, int(order), bool(bound.get("stable", False))))

    def tied(self) -> list[str]:
        """The ops that had a choice among values within their dtype's tolerance of each other."""
        found = []
        for name, source, dim, order, stable in self.choices:
            if stable or source.numel() == 0 or source.size(dim) < 2:
                continue
            values = source.double() if not source.is_complex() else source.abs().double()
            rtol, atol = tolerance(source.dtype)
            scale = float(values.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
            close = allowed_error(rtol, atol, scale)
            if order == 0:  # an extreme: tied where another element is as extreme
                largest = name in ("argmax", "max")
                extreme = values.amax(dim, keepdim=True) if largest else values.amin(dim, keepdim=True)
                tied = bool(((values - extreme).abs() <= close).sum(dim).gt(1).any())
            else:
                ordered = values.sort(dim, descending=True).values
                if order > 0:
                    ordered = ordered.narrow(dim, 0, min(order + 1, ordered.size(dim)))
                gaps = ordered.narrow(dim, 1, ordered.size(dim) - 1) - ordered.narrow(dim, 0, ordered.size(dim) - 1)
                tied = bool((gaps.abs() <= close).any())
            if tied:
                found.append(name)
        return list(dict.fromkeys(found))

    def _picked(self, indices, source, dim, reduced):
        indices = indices.to(source.device).long()
        if reduced:
            indices = indices.unsqueeze(dim)
        return source.gather(dim, indices)

    def excuses(self, actual, expected, beyond):
        """Position -> why `actual[i]`, beyond its tolerance against eager's `expected[i]` (values of eager's run
        under this mode) for each i in `beyond`, is no mismatch; positions absent are mismatches. An index output
        whose indices pick values that match those eager's pick is none; a value computed from a pick is not
        compared where some pick had tied values, unless an index output picked other values (then the picks
        differ beyond the ties, and what they feed mismatches with them)."""
        found, wrong = {}, False
        for i in sorted(beyond, key=lambda i: self._index_output(expected[i]) is None):  # index outputs first
            if self._index_output(expected[i]) is not None:
                excuse = self.excuse(actual[i], expected[i])
                wrong |= excuse is None
            else:
                excuse = None if wrong else self.excuse(actual[i], expected[i])
            if excuse:
                found[i] = excuse
        return found

    def _index_output(self, expected):
        if not isinstance(expected, torch.Tensor):
            return None
        for entry in self.index_outputs:
            indices = entry[0]
            if expected is indices or (expected.numel() == indices.numel() and expected.is_contiguous()
                                       and indices.is_contiguous() and expected.data_ptr() == indices.data_ptr()):
                return entry
        return None

    def excuse(self, actual, expected):
        """Why `actual`, beyond its tolerance against eager's `expected` (a value of eager's run under this mode),
        is no mismatch, or None where it is one: an index output whose indices pick values that match those eager's
        pick; a value computed from a pick, where some pick had tied values (see `excuses` for both at once)."""
        if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
            return None
        found = self._index_output(expected)
        if found is not None:
            indices, source, dim, reduced, name = found
            if actual.numel() != indices.numel() or actual.is_floating_point() or actual.is_complex():
                return None
            theirs = actual.reshape(indices.shape)
            if bool(((theirs < 0) | (theirs >= source.size(dim))).any()):
                return None
            ours, picked = self._picked(indices, source, dim, reduced), self._picked(theirs, source, dim, reduced)
            rtol, atol = tolerance(source.dtype)
            difference = float((picked.double() - ours.double()).abs().max()) if ours.numel() else 0.0
            scale = float(ours.double().abs().max()) if ours.numel() else 0.0
            if difference > allowed_error(rtol, atol, scale):
                return None
            moved = int((theirs.to(indices.device) != indices).sum())
            excuse = (f"its indices pick other of tied values ({name}) at {moved} of {indices.numel()} positions; "
                      "the values they pick match")
            self.differed.append(excuse)
            return excuse
        tied = self.tied() if self.depends(expected) else []
        if tied:
            excuse = f"not compared: it depends on which of tied values {', '.join(tied)} picked"
            self.differed.append(excuse)
            return excuse
        return None

    def excuse_gradient(self):
        """Why a gradient beyond its tolerance is not compared (None where it is a mismatch): the forward was seen
        to pick among tied values otherwise than eager, and a gradient follows the picks."""
        if not self.differed:
            return None
        return "not compared: the forward picked otherwise than eager among tied values, and gradients follow the picks"

# ---- end of the judging rule -----------------------------------------------------------------------------------------


EAGER, FLOAT64, EXACT = "eager", "float64 eager", "exact"


@dataclasses.dataclass(frozen=True)
class Judged:
    """The verdict on one value: its largest error against the reference, that error relative to the reference's
    largest magnitude, and the error as a fraction of what is allowed (`ratio`; above 1 is a mismatch)."""

    label: str
    abs_error: float
    rel_error: float
    ratio: float
    rtol: float
    atol: float
    allowed: float
    reference: str

    @property
    def mismatch(self) -> bool:
        return not self.ratio <= 1.0


def _wide(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    if a.is_complex() or b.is_complex():
        return torch.complex128
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64  # integers compare exactly as float64 up to 2**53, far beyond any index
    return torch.float32  # bf16, fp16 and fp32 differences are exact or within an ulp of fp32


def max_abs_difference(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """The largest |actual - expected| as a 0-dim float64 tensor on their device, without synchronising: NaN equal
    to NaN, an infinity equal to itself, a NaN or infinity against anything else infinitely far."""
    wide = _wide(actual, expected)
    a, b = actual.detach().to(wide), expected.detach().to(wide)
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=a.device)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    difference = torch.where(same, torch.zeros((), dtype=a.real.dtype, device=a.device), (a - b).abs())
    return difference.nan_to_num(nan=math.inf).amax().to(torch.float64)


def max_magnitude(value: torch.Tensor) -> torch.Tensor:
    """The largest finite |value| as a 0-dim float64 tensor (0 for an empty or non-finite one)."""
    if value.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=value.device)
    magnitude = value.detach().abs() if value.dtype is not torch.bool else value.detach().to(torch.uint8)
    return magnitude.to(torch.float64 if not value.is_floating_point() else magnitude.dtype).nan_to_num(
        nan=0.0, posinf=0.0, neginf=0.0).amax().to(torch.float64)


def _comparable(actual: Any, expected: Any) -> str | None:
    """Why two values cannot be compared element by element (None: they can)."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return "not tensors"
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)} where eager has {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} where eager has {expected.dtype}"
    if actual.device != expected.device:
        return f"device {actual.device} where eager has {expected.device}"
    return None


def scalars(values: list[torch.Tensor]) -> list[float]:
    """One device-to-host copy (one synchronisation) per device for all the 0-dim tensors of a round."""
    if not values:
        return []
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    result = [0.0] * len(values)
    for indices in by_device.values():
        for i, number in zip(indices, torch.stack([values[i] for i in indices]).tolist()):
            result[i] = number
    return result


#: `Judged.reference` of a value not compared: it follows which of tied values an index op picked (`Picks`).
NOT_COMPARED_TIE = "not compared (a pick among tied values)"
#: `Judged.reference` of an index output judged by the values its indices pick (`Picks`).
PICKED_VALUES = "the values its indices pick"


def judge(labels: Sequence[str], actual: Sequence[Any], eager: Sequence[Any],
          float64: Callable[[], Sequence[Any] | None] | None = None, picks: Picks | None = None,
          gradients: bool = False) -> list[Judged]:
    """Judges `actual[i]` against `eager[i]` (tensors, or Python values compared for equality) by `verdict`, in two
    rounds (see the module docstring). `float64()` runs eager in float64 and returns the values in the same order
    (or None where it cannot be run); it is called at most once, and only when some floating-point value needs it.
    `picks`: eager's run under `Picks`: a value still beyond what is allowed that `Picks.excuse` (for `gradients`,
    `Picks.excuse_gradient`) excuses is judged by the values its indices pick (`PICKED_VALUES`), or not compared
    (`NOT_COMPARED_TIE`, its label saying why), not held against the piece."""
    results: dict[int, Judged] = {}
    pending: list[int] = []
    device_values: list[torch.Tensor] = []
    for i, (a, e) in enumerate(zip(actual, eager)):
        reason = _comparable(a, e)
        if reason == "not tensors":
            equal = a == e if not isinstance(a, torch.Tensor) and not isinstance(e, torch.Tensor) else False
            results[i] = Judged(labels[i], 0.0 if equal else math.inf, 0.0 if equal else math.inf,
                                0.0 if equal else math.inf, 0.0, 0.0, 0.0, EXACT)
        elif reason is not None:
            results[i] = Judged(f"{labels[i]}: {reason}", math.inf, math.inf, math.inf, 0.0, 0.0, 0.0, EXACT)
        else:
            pending.append(i)
            device_values += [max_abs_difference(a, e), max_magnitude(e)]
    numbers = scalars(device_values)
    piece_scale: dict[torch.dtype, float] = {}  # the largest magnitude among the values of each dtype
    for k, i in enumerate(pending):
        piece_scale[eager[i].dtype] = max(piece_scale.get(eager[i].dtype, 0.0), numbers[2 * k + 1])
    beyond = []
    for k, i in enumerate(pending):
        error, scale = numbers[2 * k], numbers[2 * k + 1]
        rtol, atol = tolerance(eager[i].dtype)
        ratio, allowed, _ = verdict(error, scale, rtol, atol)
        exact = rtol == 0 and atol == 0
        results[i] = Judged(labels[i], error, _relative(error, scale), ratio, rtol, atol, allowed,
                            EXACT if exact else EAGER)
        if ratio > 1.0 and not exact:
            beyond.append((i, scale))
    if beyond and float64 is not None:
        reference = float64()
        if reference is not None:
            _judge_against_float64(results, beyond, actual, eager, reference, piece_scale)
    beyond_all = [i for i, judged in results.items() if judged.mismatch]
    if picks is not None and beyond_all:
        excuses = ({i: picks.excuse_gradient() for i in beyond_all} if gradients
                   else picks.excuses(actual, eager, beyond_all))
        for i, excuse in excuses.items():
            judged = results[i]
            if excuse:
                results[i] = dataclasses.replace(
                        judged, label=f"{judged.label}: {excuse}", ratio=0.0,
                        reference=NOT_COMPARED_TIE if excuse.startswith("not compared") else PICKED_VALUES)
    return [results[i] for i in range(len(results))]


def not_compared_for_ties(judged: Sequence[Judged]) -> tuple[list[Judged], str | None]:
    """(the values compared, why the others were not: None where all were), of values judged with `picks`."""
    skipped = [j.label for j in judged if j.reference == NOT_COMPARED_TIE]
    if not skipped:
        return list(judged), None
    return [j for j in judged if j.reference != NOT_COMPARED_TIE], "; ".join(skipped)


def _judge_against_float64(results: dict[int, Judged], beyond: list[tuple[int, float]], actual, eager,
                           reference, piece_scale: dict[torch.dtype, float]) -> None:
    values, usable = [], []
    for i, scale in beyond:
        f = reference[i] if i < len(reference) else None
        if isinstance(f, torch.Tensor) and f.shape == actual[i].shape and f.device == actual[i].device:
            usable.append((i, scale))
            values += [max_abs_difference(actual[i], f), max_abs_difference(eager[i], f)]
    numbers = scalars(values)
    for k, (i, scale) in enumerate(usable):
        own, noise = numbers[2 * k], numbers[2 * k + 1]
        before = results[i]
        floor = rounding_floor(eager[i].dtype, piece_scale.get(eager[i].dtype, 0.0))
        ratio, allowed, _ = verdict(before.abs_error, scale, before.rtol, before.atol, own, noise, floor)
        results[i] = dataclasses.replace(before, ratio=ratio, allowed=allowed, reference=FLOAT64)


def _relative(error: float, scale: float) -> float:
    if error == 0:
        return 0.0
    return error / scale if scale > 0 else math.inf
