"""Judging a piece's values against its eager reference on the device: the rule of the correctness sentinel.

The rule is the repro scripts' (`artifacts/repro`: the same dtype table, the same float64 slack), but for one thing:
a floating-point value passes when its largest error is within rtol * M + atol * min(1, M), M the largest magnitude
of its reference, plus, where eager itself rounds, three times eager's own largest error against a float64 run of
eager: then the value is judged by its own distance to the float64 run. The scripts allow atol + rtol * M; a fixed
floor lets any error pass in a tensor of small values (a bf16 model's gradients are ~1e-3, bf16's atol 5e-2), so
here the floor shrinks with the values below 1. That is the
accuracy minifier's idea (`torch._dynamo.utils.same` with `fp64_ref`: bf16 rounding is not a mismatch), with
maxima instead of its RMSE, because a fault that corrupts a few hundred elements of a large tensor (the H200's
nvFuser writing out of bounds) hardly moves an RMSE. Integer and bool values must be equal.

Two rounds, each with one device synchronisation for all the values of a piece: first against eager in the
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
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

#: (rtol, atol) by dtype, the repro scripts' table: a compiled piece reorders floating-point work, so results differ
#: by rounding, more with fewer mantissa bits. Integer and bool values must match exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_FLOAT8_TOLERANCE = (0.25, 0.25)
#: Eager's own error against float64, times this, is added to what a value may differ by (see the module docstring).
NOISE_SLACK = 3.0

EAGER, FLOAT64, EXACT = "eager", "float64 eager", "exact"


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for values of `dtype`; (0, 0) for exact types."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point:
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)


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


def _scalars(values: list[torch.Tensor]) -> list[float]:
    """One device-to-host copy (one synchronisation) for all the 0-dim tensors of a round."""
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


def judge(labels: Sequence[str], actual: Sequence[Any], eager: Sequence[Any],
          float64: Callable[[], Sequence[Any] | None] | None = None) -> list[Judged]:
    """Judges `actual[i]` against `eager[i]` (tensors, or Python values compared for equality), in two rounds (see
    the module docstring). `float64()` runs eager in float64 and returns the values in the same order (or None
    where it cannot be run); it is called at most once, and only when some floating-point value needs it."""
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
    numbers = _scalars(device_values)
    beyond = []
    for k, i in enumerate(pending):
        error, scale = numbers[2 * k], numbers[2 * k + 1]
        rtol, atol = tolerance(eager[i].dtype)
        exact = rtol == 0 and atol == 0
        allowed = allowed_error(rtol, atol, scale)
        ratio = (math.inf if error > 0 else 0.0) if exact else (error / allowed if allowed > 0 else
                                                                  (math.inf if error > 0 else 0.0))
        results[i] = Judged(labels[i], error, _relative(error, scale), ratio, rtol, atol, allowed,
                            EXACT if exact else EAGER)
        if ratio > 1.0 and not exact:
            beyond.append((i, scale))
    if beyond and float64 is not None:
        reference = float64()
        if reference is not None:
            _judge_against_float64(results, beyond, actual, eager, reference)
    return [results[i] for i in range(len(results))]


def _judge_against_float64(results: dict[int, Judged], beyond: list[tuple[int, float]], actual, eager,
                           reference) -> None:
    values, usable = [], []
    for i, scale in beyond:
        f = reference[i] if i < len(reference) else None
        if isinstance(f, torch.Tensor) and f.shape == actual[i].shape and f.device == actual[i].device:
            usable.append((i, scale))
            values += [max_abs_difference(actual[i], f), max_abs_difference(eager[i], f)]
    numbers = _scalars(values)
    for k, (i, scale) in enumerate(usable):
        own, noise = numbers[2 * k], numbers[2 * k + 1]
        before = results[i]
        allowed = allowed_error(before.rtol, before.atol, scale) + NOISE_SLACK * noise
        ratio = own / allowed if allowed > 0 else (math.inf if own > 0 else 0.0)
        results[i] = dataclasses.replace(before, ratio=ratio,
                                         allowed=allowed, reference=FLOAT64)


def allowed_error(rtol: float, atol: float, scale: float) -> float:
    """What a value whose reference's largest magnitude is `scale` may differ by, before eager's own noise.

    Example (bfloat16: 5 % of the values' size, atol at full height only for values of 1 and above):
        >>> allowed_error(0.05, 0.05, 10.0), allowed_error(0.05, 0.05, 1e-3)
        (0.55, 0.0001)
    """
    return rtol * scale + atol * min(1.0, scale)


def _relative(error: float, scale: float) -> float:
    if error == 0:
        return 0.0
    return error / scale if scale > 0 else math.inf


# ---- the float64 reference ----------------------------------------------------------------------------------------

_NARROWING_METHODS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})


def _widened(value: Any) -> Any:
    if isinstance(value, torch.dtype) and value.is_floating_point and value is not torch.float64:
        return torch.float64
    return value


class Float64Mode(TorchFunctionMode):
    """Runs torch code in float64: every floating dtype an op is asked for (`x.to(torch.bfloat16)`,
    `torch.zeros(..., dtype=torch.float32)`, `x.float()`) becomes float64. With inputs in float64 (`to_float64`),
    an FX module or a fusion region's torch function then computes in float64 throughout.

    Why not `torch._dynamo.debug_utils.cast_to_fp64`: it rewrites the dtype arguments of aten-level FX graphs
    (`prims.convert_element_type` and `dtype=` keywords) but not the `Tensor.to` / `.float()` method calls of the
    Dynamo graphs ThunderFX splits, and a fusion region's reference is a Python function, not an FX graph.

    Example:
        >>> with Float64Mode():
        ...     torch.ones(2, dtype=torch.bfloat16).dtype, torch.ones(2).double().float().dtype
        (torch.float64, torch.float64)
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _NARROWING_METHODS:
            return args[0].double() if args[0].is_floating_point() and not args[0].is_complex() else func(*args)
        args, kwargs = tree_map(_widened, (tuple(args), kwargs))
        return func(*args, **kwargs)


def to_float64(values: Sequence[Any], requires_grad: bool = False) -> list[Any]:
    """Floating-point tensors as float64 copies (leaves that require grad where `requires_grad` and the original
    did); other values as they are."""
    result = []
    for x in values:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            wide = x.detach().to(torch.float64)
            result.append(wide.requires_grad_(requires_grad and x.requires_grad))
        else:
            result.append(x)
    return result
