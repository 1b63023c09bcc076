"""Is a timing change real or noise? A rank test on the raw samples of two runs, no numpy or scipy needed.

The test is Mann-Whitney's U (two-sided): it asks whether a sample of run B tends to be larger than one of run A,
using only the order of the samples, so a few outliers (a GC pause, another process) do not decide it, and it
needs no assumption about the shape of the distribution. For small samples (m * n <= 2500, no ties) the p-value is
exact, from U's distribution counted by dynamic programming; for larger ones it uses the normal approximation
with the tie correction.

With very few samples no ordering is unlikely enough (2 samples against 2 give p >= 0.33 at best); there the
verdict falls back to whether the sample ranges [min, max] of the two runs are disjoint, and says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import lru_cache

from thunderfx_debug.records import Timing

#: Changes with p below this are beyond noise.
ALPHA = 0.05
#: ... and so are only changes of at least this relative size: a 0.5% shift over 10,000 samples is real but not news.
MIN_EFFECT = 0.02


@dataclasses.dataclass(frozen=True)
class Change:
    """The timing change of one piece between run A and run B.

    `ratio` is median(B) / median(A) (above 1: B is slower); `p_value` the two-sided Mann-Whitney p (None when a
    run has no samples); `method` "mann-whitney" or "disjoint ranges" (too few samples for the rank test);
    `significant` whether the change is beyond noise by that method and at least MIN_EFFECT in size.
    """

    ratio: float | None
    p_value: float | None
    method: str
    significant: bool

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "not comparable"
        if not self.significant:
            return "within noise"
        return "slower" if self.ratio > 1 else "faster"


def compare_timings(a: Timing | None, b: Timing | None) -> Change:
    """The change from `a` to `b` (see `Change`); timings without samples are not comparable."""
    if a is None or b is None or not a.count or not b.count:
        return Change(None, None, "no samples", False)
    ratio = b.median_ms / a.median_ms if a.median_ms else None
    big_enough = ratio is not None and abs(ratio - 1) >= MIN_EFFECT
    # The uniform samples: of a long run, the raw samples kept also hold its first and last ones, overrepresented.
    samples_a, samples_b = a.uniform_samples_ms, b.uniform_samples_ms
    p = mann_whitney_p(samples_a, samples_b)
    if smallest_possible_p(len(samples_a), len(samples_b)) < ALPHA:
        return Change(ratio, p, "mann-whitney", big_enough and p < ALPHA)
    disjoint = a.max_ms < b.min_ms or b.max_ms < a.min_ms
    return Change(ratio, p, "disjoint ranges", big_enough and disjoint)


def smallest_possible_p(m: int, n: int) -> float:
    """The smallest two-sided p the exact test can give for sample sizes m and n (all of one run below the other)."""
    return min(1.0, 2.0 / math.comb(m + n, m))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Mann-Whitney's U test for samples `a` and `b` (each non-empty)."""
    m, n = len(a), len(b)
    ranks = _midranks([*a, *b])
    u = sum(ranks[:m]) - m * (m + 1) / 2
    ties = len(set(a) | set(b)) < m + n
    if m * n <= 2500 and not ties:
        total = math.comb(m + n, m)
        low = min(u, m * n - u)
        tail = sum(_u_counts(m, n)[: int(math.floor(low)) + 1]) / total
        return min(1.0, 2 * tail)
    mean = m * n / 2
    tie_term = sum(t**3 - t for t in _tie_sizes([*a, *b]))
    variance = m * n / 12 * ((m + n + 1) - tie_term / ((m + n) * (m + n - 1)))
    if variance <= 0:
        return 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(variance)  # with continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def _midranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _tie_sizes(values: Sequence[float]) -> list[int]:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return [c for c in counts.values() if c > 1]


@lru_cache(maxsize=64)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of m A-samples and n B-samples give U = 0, 1, ..., m*n (U counts the pairs a > b)."""
    # counts[j][u] for the current m': adding the largest remaining sample from A adds j to U (it beats all j B's).
    previous = [[1] for _ in range(n + 1)]  # m' = 0: U is 0 for any n'
    for mm in range(1, m + 1):
        current = [[1]]  # n' = 0: U is 0
        for nn in range(1, n + 1):
            size = mm * nn + 1
            row = [0] * size
            # the largest sample overall is from A (adds nn to U) or from B (adds nothing)
            for u, c in enumerate(previous[nn]):
                row[u + nn] += c
            for u, c in enumerate(current[nn - 1]):
                row[u] += c
            current.append(row)
        previous = current
    return tuple(previous[n])
