"""Is a timing change between two runs real, or noise? Pure Python (no numpy or scipy needed).

A diff judges every timed piece of two runs at once (graphs, splits, fusion regions, op groups: tens to hundreds of
them), from few samples each, on machines whose speed drifts within a run and differs between runs. Each of these
misleads a plain per-piece test, and each has a part here:

1. Timings are multiplicative and have outliers (a GC pause, a preempted call): each piece is compared on the log
   of its times with Yuen's test, a Welch t test of 20%-trimmed means with winsorised variances (`stats.TRIM`), which a
   few outliers cannot move, and which keeps far more power at six samples than a rank test (Mann-Whitney with 6
   against 6 samples cannot reach p < 0.0022).
2. A few percent of difference between two runs is the machine, not the code: the test asks whether the change is
   beyond +-`MIN_EFFECT` (a minimum-effect null hypothesis, |log(B/A)| <= log(1 + MIN_EFFECT)), not whether it is
   exactly zero, which any difference passes with enough samples.
3. Testing 30 pieces at p < 0.05 flags one by chance in most diffs: Holm's correction keeps the chance of any false
   flag in the whole diff below `ALPHA`.
4. Another machine, another clock boost, or a busy neighbour moves every piece of a run alike: with at least
   `MIN_PIECES_FOR_SHIFT` pieces, the run-wide shift (the median over pieces of their shifts) is estimated and
   reported on its own where it reaches `SHIFT_REPORTED`, so that a global change is shown as one, not blamed on
   each piece; each piece is judged relative to it. Pieces do not follow a change of the machine alike, and that
   spread (beyond their own noise) adds to each piece's error (`run_wide_shift`): a piece that followed the machine
   less than the others has not changed on its own.

Verdicts say when nothing can be said: "too few samples to judge" (fewer than `MIN_SAMPLES` in a run), "too noisy
to judge" (not even a change of `NOISY_RESOLUTION`x could have been told from noise at the corrected level).
Samples go in as the callers choose them: the diff passes each piece's headline samples (`headline`: the first
sampled call and disturbed calls left out).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from thunderfx_debug.records.stats import t_isf, t_sf, yuen
from thunderfx_debug.render.headline import MIN_SAMPLES

#: Family-wise error rate of one diff: the chance that any piece of two runs without change is flagged.
ALPHA = 0.05
#: Changes up to this size (relative) are not changes: 10%.
MIN_EFFECT = 0.10
#: A piece that could not show a change of this ratio beyond noise (with `POWER`) is "too noisy to judge".
NOISY_RESOLUTION = 1.5
#: ... where "could show" means: a change of that size would be flagged with this probability.
POWER = 0.9
#: Fewer judged pieces than this and the run-wide shift is not estimated (a median of few follows a real change).
MIN_PIECES_FOR_SHIFT = 8
#: A run-wide shift of at least this size is reported.
SHIFT_REPORTED = 0.05


class ChangeOutcome(str, enum.Enum):
    """What the diff found of one piece's time from run A to run B."""

    SLOWER = "slower"
    FASTER = "faster"
    WITHIN_NOISE = "within noise"
    TOO_FEW = "too few samples to judge"
    TOO_NOISY = "too noisy to judge"
    NOT_COMPARABLE = "not comparable"  # a run has no samples of the piece


@dataclasses.dataclass(frozen=True)
class Change:
    """The judged change of one piece from run A to run B.

    `ratio` is B/A (the ratio of the trimmed geometric means; above 1: B is slower), `relative_ratio` the same
    after the run-wide shift is taken out (what the verdict judges), `p_value` the minimum-effect p before the
    correction, `resolution` the smallest relative ratio this piece would have shown beyond noise with probability
    `POWER` (where it is above `NOISY_RESOLUTION`, an unflagged piece is "too noisy to judge")."""

    ratio: float | None
    relative_ratio: float | None
    p_value: float | None
    resolution: float | None
    verdict: ChangeOutcome

    @property
    def significant(self) -> bool:
        return self.verdict in (ChangeOutcome.SLOWER, ChangeOutcome.FASTER)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The changes of all pieces of a diff (in the order given), the run-wide shift B/A (None: not estimated), and how
    much the pieces' shifts spread around it beyond their own noise (log scale; see `run_wide_shift`)."""

    changes: list[Change]
    shift: float | None
    spread: float = 0.0

    @property
    def shift_reported(self) -> bool:
        return self.shift is not None and abs(math.log(self.shift)) >= math.log1p(SHIFT_REPORTED)


# ---- a whole diff ------------------------------------------------------------------------------------------------
def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down correction: which of the p-values stay significant with a family-wise error below `alpha`.

    Example (alone, 0.03 would pass; one of three at 0.05 / 2 does not):
        >>> holm([0.001, 0.03, 0.04])
        [True, False, False]
    """
    order = sorted(range(len(p_values)), key=p_values.__getitem__)
    significant = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        significant[i] = True
    return significant


def _logs(samples: Sequence[float]) -> list[float]:
    return [math.log(s) for s in samples if s > 0]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


#: The median of a chi-square variable with one degree of freedom: of (deviation / error)^2 of a piece that follows
#: the run-wide shift within its error.
_CHI2_1_MEDIAN = 0.454936


def run_wide_shift(tests: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(the run-wide shift of log time, the squared spread of how pieces follow it) from each piece's (shift, standard
    error), or (0, 0) with fewer than `MIN_PIECES_FOR_SHIFT` pieces.

    The shift is the median of the pieces' shifts. Pieces do not all follow a change of the machine alike (a busy
    neighbour, or a slow call that trimming keeps in one piece and drops from another), so around the shift they
    spread by more than their own errors; that spread is the variance which, added to each piece's squared error,
    makes the median of the pieces' squared standardised deviations that of a chi-square with one degree of freedom.
    Both are medians: one piece that really changed moves neither, however precisely it was measured.
    """
    if len(tests) < MIN_PIECES_FOR_SHIFT:
        return 0.0, 0.0
    shift = _median([d for d, _ in tests])
    deviations2 = [(d - shift) ** 2 for d, _ in tests]
    variances = [max(e * e, 1e-18) for _, e in tests]

    def excess(spread2: float) -> float:
        return _median([d2 / (v + spread2) for d2, v in zip(deviations2, variances)]) - _CHI2_1_MEDIAN

    if excess(0.0) <= 0:
        return shift, 0.0
    low, high = 0.0, max(deviations2)
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if excess(middle) > 0 else (low, middle)
    return shift, high


def judge(pairs: Sequence[tuple[Sequence[float] | None, Sequence[float] | None]], alpha: float = ALPHA,
          min_effect: float = MIN_EFFECT) -> Judgement:
    """Judges the change of every piece (its samples in run A, in run B) of one diff together (see the module
    docstring). A piece missing from a run (None) is not comparable; with fewer than `MIN_SAMPLES` samples in a run,
    there are too few to judge.

    Example (the second piece 1.5x slower in B, the first the same; too few pieces for a run-wide shift):
        >>> a = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]
        >>> [c.verdict.value for c in judge([(a, a[::-1]), (a, [1.5 * x for x in a])]).changes]
        ['within noise', 'slower']
    """
    threshold = math.log1p(min_effect)
    logs = [(_logs(a or ()), _logs(b or ())) for a, b in pairs]
    judged = [i for i, (la, lb) in enumerate(logs) if len(la) >= MIN_SAMPLES and len(lb) >= MIN_SAMPLES]
    tests = {i: yuen(*logs[i]) for i in judged}
    shift, spread2 = run_wide_shift([tests[i][:2] for i in judged])

    def error_of(i: int) -> float:
        return math.sqrt(tests[i][1] ** 2 + spread2)

    def p_value(i: int) -> float:
        difference, _, df = tests[i]
        beyond, error = abs(difference - shift) - threshold, error_of(i)
        return (0.0 if beyond > 0 else 1.0) if error == 0 else t_sf(beyond / error, df)

    p_values = {i: p_value(i) for i in judged}
    significant = dict(zip(judged, holm([p_values[i] for i in judged], alpha)))
    strictest = alpha / max(len(judged), 1)  # Holm's first threshold: what a lone change has to pass
    changes = []
    for i, (la, lb) in enumerate(logs):
        if pairs[i][0] is None or pairs[i][1] is None:
            changes.append(Change(None, None, None, None, ChangeOutcome.NOT_COMPARABLE))
            continue
        if i not in tests:
            ratio = math.exp(sum(lb) / len(lb) - sum(la) / len(la)) if la and lb else None
            changes.append(Change(ratio, None, None, None, ChangeOutcome.TOO_FEW))
            continue
        difference, _, df = tests[i]
        error = error_of(i)
        resolution = math.exp(threshold + (t_isf(strictest, df) + t_isf(1 - POWER, df)) * error)
        if significant[i]:
            verdict = ChangeOutcome.SLOWER if difference > shift else ChangeOutcome.FASTER
        elif resolution > NOISY_RESOLUTION:
            verdict = ChangeOutcome.TOO_NOISY
        else:
            verdict = ChangeOutcome.WITHIN_NOISE
        changes.append(Change(math.exp(difference), math.exp(difference - shift), p_values[i], resolution, verdict))
    return Judgement(changes, math.exp(shift) if len(judged) >= MIN_PIECES_FOR_SHIFT else None, math.sqrt(spread2))
