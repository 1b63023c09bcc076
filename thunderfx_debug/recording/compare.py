"""Judging a piece's values against its eager reference on the device, by the rule every repro script applies too
(`scripts/judging_rule.py`: the tolerances, `verdict`, the float64 yardstick `Float64Mode`, `Picks` for ties).

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
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.scripts.judging_rule import Picks, rounding_floor, tolerance, verdict

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
