"""Statistics of timings, pure Python (no numpy or scipy needed): Student's t distribution and Yuen's test of
trimmed means. Shared by the diff's noise model (`render.noise`) and the flush-time triage (`triage.judging`), which
judge timings of different runs and of two compilers the same way: on log times, with a test a few outliers cannot
move."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

#: Share of samples trimmed from each end before comparing means.
TRIM = 0.2


# ---- Student's t distribution ------------------------------------------------------------------------------------
def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-13:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom.

    Example (the 97.5% point of t with 10 degrees of freedom is 2.228):
        >>> round(t_sf(2.228, 10), 4), t_sf(0.0, 3)
        (0.025, 0.5)
    """
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def _t_pdf(t: float, df: float) -> float:
    log_density = (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                   - (df + 1) / 2 * math.log1p(t * t / df))
    return math.exp(log_density)


def t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = p (0 < p < 0.5): Newton's method, kept inside a bracket that bisection narrows.

    Example:
        >>> round(t_isf(0.025, 10), 3), round(t_isf(0.005, 3), 3)
        (2.228, 5.841)
    """
    low, high = 0.0, 1.0
    while t_sf(high, df) > p:
        low, high = high, 2.0 * high
    t = (low + high) / 2.0
    for _ in range(60):
        excess = t_sf(t, df) - p
        if excess > 0:
            low = t
        else:
            high = t
        if abs(excess) <= 1e-10 * p or high - low < 1e-10 * max(1.0, high):
            break
        step = t + excess / _t_pdf(t, df)  # P(T > t) falls by the density
        if abs(step - t) < 1e-12 * max(1.0, t):
            break
        t = step if low < step < high else (low + high) / 2.0
    return t


# ---- Yuen's trimmed-means test -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Trimmed:
    """A sample's trimmed mean, the squared standard error of it (from the winsorised variance), and how many
    values the trimmed mean kept."""

    mean: float
    error2: float
    kept: int


def trimmed(values: Sequence[float], trim: float = TRIM) -> Trimmed:
    """Example: the outlier 100 is trimmed away (mean of 2, 3, 4) and winsorised (variance of 2, 2, 3, 4, 4):
        >>> t = trimmed([1.0, 2.0, 3.0, 4.0, 100.0]); t.mean, t.kept, round(t.error2, 4)
        (3.0, 3, 0.6667)
    """
    ordered = sorted(values)
    n = len(ordered)
    g = int(math.floor(trim * n))
    kept = ordered[g:n - g]
    h = len(kept)
    winsorised = [ordered[g]] * g + kept + [ordered[n - g - 1]] * g
    mean_w = math.fsum(winsorised) / n
    variance_w = math.fsum((v - mean_w) ** 2 for v in winsorised) / (n - 1)
    return Trimmed(math.fsum(kept) / h, (n - 1) * variance_w / (h * (h - 1)), h)


def yuen(a: Sequence[float], b: Sequence[float], trim: float = TRIM) -> tuple[float, float, float]:
    """(trimmed mean of b - trimmed mean of a, its standard error, Welch's degrees of freedom); each sample needs
    enough values that at least 2 survive the trimming."""
    ta, tb = trimmed(a, trim), trimmed(b, trim)
    error2 = ta.error2 + tb.error2
    if error2 <= 0:
        return tb.mean - ta.mean, 0.0, float(ta.kept + tb.kept - 2)
    df = error2 * error2 / (ta.error2 ** 2 / (ta.kept - 1) + tb.error2 ** 2 / (tb.kept - 1))
    return tb.mean - ta.mean, math.sqrt(error2), df
