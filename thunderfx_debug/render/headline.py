"""The headline statistics of a timed piece: which of its samples the figures in summaries, pages and diffs use, and
whether there are enough of them, with little enough spread, to be read as the piece's time.

The rule (every sample stays in the records; only the headline leaves some out):
- the first sampled call of each piece (`COLD_SAMPLES`): it pays for cold caches, the allocator's first requests
  and lazy initialisation (on CPU, a first sample 10-30x the rest is common);
- the sampled calls of its graph during which the process compiled something or the host thread was preempted
  (`records.GraphRecord.disturbed`, see `records.Disturbance`);
- the sampled calls on which the pieces of its graph and phase were slow together (`slow_together`): a garbage
  collection, a neighbour's burst of work or a stall of the machine slows every piece of a call at once.
A piece with fewer than `MIN_SAMPLES` headline samples is marked "too few samples"; one whose 90th percentile is more
than `NOISY_SPREAD` times its 10th is marked "noisy". Where nothing is left, the figures fall back to all the
samples, marked "too few samples". A figure made of such medians (the step, the time in the compiled graphs per
step, the time a triaged piece loses per step) is marked as the thinnest of them is, next to the number.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Iterable, Sequence

from thunderfx_debug.records import MIN_SAMPLES, GraphRecord, Phase, Timing

COLD_SAMPLES = 1
NOISY_SPREAD = 2.0


def headline_samples(timing: Timing, left_out_calls: Collection[int] = ()) -> tuple[float, ...]:
    """The samples the headline uses, in call order (see the module docstring). Of a long run, whose timing keeps a
    selection of its samples (`records.Timing`), the uniform sample: the selection over-represents the first and the
    last samples of the run."""
    calls = timing.calls if len(timing.calls) == len(timing.samples_ms) else range(1, len(timing.samples_ms) + 1)
    pairs = list(zip(calls, timing.samples_ms))
    cold = set(sorted(c for c, _ in pairs)[:COLD_SAMPLES])
    if not timing.complete:
        pairs = [pairs[i] for i in timing.uniform]
    return tuple(ms for call, ms in sorted(pairs, key=lambda pair: pair[0])
                 if call not in cold and call not in left_out_calls)


#: A call is slow together when the median over a phase's pieces of (log sample - log median of the piece) exceeds
#: the calls' typical value by this many robust standard deviations, and by at least SLOW_TOGETHER_MIN_RATIO.
SLOW_TOGETHER_SIGMAS = 4.0
SLOW_TOGETHER_MIN_RATIO = 1.25


def _median(values: list[float]) -> float:
    return statistics.median(values)


def slow_together(timings: Iterable[Timing]) -> frozenset[int]:
    """The calls on which the pieces of one graph and phase (`timings`) were slow together: for each call, the median
    over the pieces sampled on it (at least 3) of how far the piece's sample lies above the piece's own median (log
    scale); the calls where that stands out (see SLOW_TOGETHER_SIGMAS) are left out of every piece's headline.

    Example (four pieces, call 16 three times slower in all of them):
        >>> pieces = [Timing((1.0, 1.1, 3.0, 0.9, 1.0), (6, 11, 16, 21, 26)) for _ in range(4)]
        >>> sorted(slow_together(pieces))
        [16]
    """
    by_call: dict[int, list[float]] = {}
    for timing in timings:
        pairs = [(c, ms) for c, ms in zip(timing.calls, timing.samples_ms) if ms > 0]
        if len(pairs) < MIN_SAMPLES:
            continue
        centre = _median([math.log(ms) for _, ms in pairs])
        for call, ms in pairs:
            by_call.setdefault(call, []).append(math.log(ms) - centre)
    common = {call: _median(values) for call, values in by_call.items() if len(values) >= 3}
    if len(common) < MIN_SAMPLES:
        return frozenset()
    typical = _median(list(common.values()))
    scale = 1.4826 * _median([abs(v - typical) for v in common.values()])
    bar = max(SLOW_TOGETHER_SIGMAS * scale, math.log(SLOW_TOGETHER_MIN_RATIO))
    return frozenset(call for call, value in common.items() if value - typical > bar)


def _phase_timings(graph: GraphRecord, phase: Phase) -> list[Timing]:
    forward = phase is Phase.FORWARD
    timings = [graph.timing if forward else graph.backward_timing]
    for split in graph.splits:
        timings.append(split.timing if forward else split.backward_timing)
        timings += [f.timing for f in split.fusions_in(phase)]
        timings.append(split.outside_fusions_timing.get(f"outside_{phase.value}"))
        timings += [g.timing for g in split.op_groups if g.phase is phase]
    return [t for t in timings if t is not None]


def left_out_calls(graph: GraphRecord) -> frozenset[int]:
    """The sampled calls of `graph` that no headline statistic of its pieces uses: those the recorder saw disturbed
    (a compile, preemption) and those on which its pieces were slow together (forward or backward)."""
    return (frozenset(d.call for d in graph.disturbed) | slow_together(_phase_timings(graph, Phase.FORWARD))
            | slow_together(_phase_timings(graph, Phase.BACKWARD)))


@dataclasses.dataclass(frozen=True)
class Headline:
    """The headline of a timing: `samples_ms` used, `left_out` kept raw but not used; statistics in ms. Where the
    rule leaves nothing (`fallback`), the statistics come from all the samples, and the headline has none."""

    samples_ms: tuple[float, ...]
    left_out: int
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    fallback: bool = False
    basis: int = 0  # how many samples the statistics come from

    @property
    def count(self) -> int:
        return len(self.samples_ms)

    @property
    def few(self) -> bool:
        return self.count < MIN_SAMPLES

    @property
    def spread(self) -> float | None:
        """p90 / p10 of the headline samples (None with fewer than two, or a p10 of 0)."""
        if self.count < 2 or not self.p10_ms:
            return None
        return self.p90_ms / self.p10_ms

    @property
    def noisy(self) -> bool:
        return not self.few and (self.spread or 0.0) > NOISY_SPREAD

    @property
    def flag(self) -> str | None:
        """"too few samples (2)", "noisy (p90 3.1x p10)", or None."""
        if self.few:
            return too_few_samples(self.basis if self.fallback else self.count)
        if self.noisy:
            return f"noisy (p90 {self.spread:.1f}x p10)"
        return None


def too_few_samples(count: int) -> str | None:
    """"too few samples (n)" for a figure that rests on `count` samples, fewer than MIN_SAMPLES; None for more.

    Example:
        >>> too_few_samples(1), too_few_samples(MIN_SAMPLES)
        ('too few samples (1)', None)
    """
    return f"too few samples ({count})" if count < MIN_SAMPLES else None


def thinnest(headlines: Iterable[Headline]) -> str | None:
    """The "too few samples (n)" flag of a figure made of several headline medians (a sum per step, say): it rests on
    as few samples as the thinnest of them; None where each has enough."""
    few = [h for h in headlines if h.few]
    return min(few, key=lambda h: h.basis if h.fallback else h.count).flag if few else None


def _decile(sorted_values: list[float], tenths: int) -> float:
    """Linear interpolation between closest ranks (numpy's default), as `records.Timing` computes its p10 and p90."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=10, method="inclusive")[tenths - 1]


def summed_headline(timings: Sequence[Timing | None], left_out: Collection[int] = ()) -> Headline | None:
    """The headline of the per-call sums of `timings` (a split's forward and backward), over the calls every one of
    them sampled; None where none was timed. A None among them (a piece without a backward) adds nothing."""
    present = [t for t in timings if t is not None and t.count]
    if not present:
        return None
    calls = set(present[0].by_call).intersection(*(t.by_call for t in present[1:]))
    ordered = sorted(calls)
    return headline(Timing(tuple(sum(t.by_call[c] for t in present) for c in ordered), tuple(ordered),
                           present[0].clock), left_out)


def headline(timing: Timing, left_out: Collection[int] = ()) -> Headline:
    used = headline_samples(timing, left_out)
    pool = timing.uniform_samples_ms
    values = sorted(used) if used else sorted(pool)  # nothing left: all of them, marked as too few
    if not values:
        return Headline((), 0, None, None, None)
    return Headline(used, 0 if not used else len(pool) - len(used), statistics.median(values), _decile(values, 1),
                    _decile(values, 9), fallback=not used, basis=len(values))
