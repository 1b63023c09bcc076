"""The diff's statistics (`render.noise`, `render.diff`) on seeded fake runs: samples from a noisy, drifting machine
(run-to-run offsets, drift and a random walk within a run, per-piece noise, outliers, cold first samples, calls that
slow every piece at once). Pairs of identical runs must show no change; a piece made 1.5x slower must be found; and
where the samples cannot tell, the diff must say so. Nothing here is timed: the samples are generated."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from thunderfx_debug.records import stats
from thunderfx_debug.records import GraphRecord, RankRecord, SplitKind, SplitRecord, Timing
from thunderfx_debug.render import noise
from thunderfx_debug.render.diff import diff_reports, render_diff
from thunderfx_debug.render.noise import ChangeOutcome, judge


@dataclasses.dataclass(frozen=True)
class Machine:
    """How a fake machine's timings vary (log scale): between runs, within a run, per sample."""

    run_sigma: float  # a whole run faster or slower (another node, clock boost)
    drift: float  # linear drift over a run, up to +-
    walk: float  # random walk step per call
    noise: tuple[float, float]  # per-piece noise, drawn in this range
    outliers: tuple[float, float]  # share of outlier samples, their largest factor
    cold: float  # largest factor of a piece's first sample
    shared: tuple[float, float]  # share of calls that slow every piece (GC, another process), largest factor


GPU = Machine(0.01, 0.02, 0.002, (0.01, 0.05), (0.01, 3.0), 5.0, (0.02, 1.5))
CPU = Machine(0.04, 0.05, 0.005, (0.02, 0.12), (0.05, 10.0), 20.0, (0.05, 5.0))


def fake_run(rng: random.Random, base_ms: list[float], calls: int, machine: Machine,
             slower: dict[int, float] | None = None) -> list[list[float]]:
    """Samples of every piece on `calls` sampled calls of one run."""
    offset = rng.gauss(0, machine.run_sigma)
    slope = rng.uniform(-machine.drift, machine.drift)
    walk, common = 0.0, []
    for i in range(calls):
        walk += rng.gauss(0, machine.walk)
        hit = rng.random() < machine.shared[0]
        common.append(offset + slope * (i / max(calls - 1, 1) - 0.5) + walk
                      + (math.log(rng.uniform(1.05, machine.shared[1])) if hit else 0.0))
    runs = []
    for k, base in enumerate(base_ms):
        sigma = rng.uniform(*machine.noise)
        factor = math.log((slower or {}).get(k, 1.0))
        samples = []
        for i in range(calls):
            log_ms = math.log(base) + factor + common[i] + rng.gauss(0, sigma)
            if rng.random() < machine.outliers[0]:
                log_ms += math.log(rng.uniform(1.2, machine.outliers[1]))
            if i == 0:
                log_ms += math.log(rng.uniform(1.0, machine.cold))
            samples.append(math.exp(log_ms))
        runs.append(samples)
    return runs


def pairs_of(a: list[list[float]], b: list[list[float]], cold: int = 1):
    """Each piece's samples without its first (cold) one, as the headline has them."""
    return [(x[cold:], y[cold:]) for x, y in zip(a, b)]


def _record(samples: list[list[float]]) -> RankRecord:
    """Fake runs as records: graph0 with one split per piece, every piece's samples on calls 6, 11, 16, ..., and the
    graph's own forward their sum."""
    def timing(values):
        return Timing(tuple(values), tuple(6 + 5 * i for i in range(len(values))), "cuda")

    splits = tuple(SplitRecord(f"thunder_{k}", SplitKind.THUNDER, timing=timing(s)) for k, s in enumerate(samples))
    graph = GraphRecord("graph0", 0, splits=splits, calls=1000, timing=timing([sum(c) for c in zip(*samples)]))
    return RankRecord(graphs=(graph,))


def _verdicts(a: list[list[float]], b: list[list[float]]) -> list[ChangeOutcome]:
    """The diff's verdict on each piece (the splits, in order): records in, as `thunderfx-debug diff` reads them."""
    changes = {t.path: t.change.verdict for t in diff_reports(_record(a), _record(b)).timings}
    return [changes[f"graph0/thunder_{k}"] for k in range(len(a))]


@pytest.mark.parametrize("machine, pieces, calls", [(GPU, 16, 6), (GPU, 60, 20), (CPU, 30, 10), (CPU, 30, 30)])
def test_identical_runs_show_no_change(machine, pieces, calls):
    rng = random.Random(f"{machine}{pieces}{calls}")
    flagged = 0
    for _ in range(60):
        base = [math.exp(rng.uniform(math.log(0.01), math.log(20))) for _ in range(pieces)]
        d = diff_reports(_record(fake_run(rng, base, calls, machine)), _record(fake_run(rng, base, calls, machine)))
        flagged += len(d.significant_timings)
    assert flagged == 0


@pytest.mark.parametrize("machine, pieces, calls, power",
                         [(GPU, 16, 6, 0.75), (GPU, 60, 20, 0.95), (CPU, 30, 30, 0.85)])
def test_a_piece_one_and_a_half_times_slower_is_found_and_nothing_else(machine, pieces, calls, power):
    rng = random.Random(f"slow{machine}{pieces}{calls}")
    found, trials = 0, 40
    for _ in range(trials):
        base = [math.exp(rng.uniform(math.log(0.01), math.log(20))) for _ in range(pieces)]
        slow = rng.randrange(pieces)
        verdicts = _verdicts(fake_run(rng, base, calls, machine), fake_run(rng, base, calls, machine, slower={slow: 1.5}))
        # A miss is said to be too noisy to judge, never passed as "within noise" (or "faster").
        assert verdicts[slow] in (ChangeOutcome.SLOWER, ChangeOutcome.TOO_NOISY), verdicts[slow]
        found += verdicts[slow] is ChangeOutcome.SLOWER
        assert not any(v in (ChangeOutcome.SLOWER, ChangeOutcome.FASTER) for i, v in enumerate(verdicts) if i != slow)
    assert found >= power * trials, found


def test_a_run_wide_shift_is_reported_not_blamed_on_every_piece():
    rng = random.Random(3)
    base = [math.exp(rng.uniform(math.log(0.05), math.log(5))) for _ in range(20)]
    a = fake_run(rng, base, 12, GPU)
    b = [[1.2 * ms for ms in samples] for samples in fake_run(rng, base, 12, GPU, slower={4: 1.5})]
    result = judge(pairs_of(a, b))
    assert result.shift == pytest.approx(1.2, rel=0.03) and result.shift_reported
    assert [i for i, c in enumerate(result.changes) if c.significant] == [4]
    assert result.changes[4].relative_ratio == pytest.approx(1.5, rel=0.05)
    assert result.changes[0].ratio == pytest.approx(1.2, rel=0.05)  # the raw ratio is still shown


def test_what_cannot_be_judged_says_why():
    steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    wild = [1.0, 4.0, 0.3, 2.5, 0.5, 6.0, 0.2, 3.0]
    result = judge([(steady, steady[:3]), (wild, [x * 1.4 for x in wild[::-1]]), (steady, None),
                    (steady, steady[::-1])])
    assert [c.verdict for c in result.changes] == [ChangeOutcome.TOO_FEW, ChangeOutcome.TOO_NOISY,
                                                   ChangeOutcome.NOT_COMPARABLE, ChangeOutcome.WITHIN_NOISE]
    assert result.changes[1].resolution > noise.NOISY_RESOLUTION
    assert result.shift is None  # too few pieces to estimate one


def test_changes_below_the_minimum_effect_are_not_changes():
    rng = random.Random(5)
    a = [1.0 + 0.001 * rng.random() for _ in range(200)]
    b = [1.05 * (1.0 + 0.001 * rng.random()) for _ in range(200)]
    (change,) = judge([(a, b)]).changes
    assert change.ratio == pytest.approx(1.05, rel=1e-3)  # real, measured precisely, and not news
    assert change.verdict is ChangeOutcome.WITHIN_NOISE
    (change,) = judge([(a, [1.12 * x for x in a])]).changes
    assert change.verdict is ChangeOutcome.SLOWER


def test_yuen_ignores_a_few_outliers_that_move_a_plain_mean():
    a = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    b = a[:8] + [40.0, 55.0]  # a GC pause and a preempted call
    difference, error, _ = stats.yuen([math.log(x) for x in a], [math.log(x) for x in b])
    assert abs(difference) < 0.01
    (change,) = judge([(a, b)]).changes
    assert change.verdict is ChangeOutcome.WITHIN_NOISE


def test_diff_of_identical_fake_runs_flags_nothing_and_a_slowdown_is_named():
    rng = random.Random(11)
    base = [math.exp(rng.uniform(math.log(0.05), math.log(5))) for _ in range(12)]
    a = _record(fake_run(rng, base, 15, GPU))
    same = diff_reports(a, _record(fake_run(rng, base, 15, GPU)))
    assert same.significant_timings == []
    assert "no piece changed beyond noise" in render_diff(same)
    slowed = diff_reports(a, _record(fake_run(rng, base, 15, GPU, slower={7: 1.5})))
    assert [(t.path, t.change.verdict) for t in slowed.significant_timings] == [
        ("graph0/thunder_7", ChangeOutcome.SLOWER)]
    text = render_diff(slowed)
    assert "graph0/thunder_7 forward" in text and "SLOWER" in text and "device time (cuda clock)" in text


def _scaled(run: list[list[float]], factors: dict[int, float], default: float) -> list[list[float]]:
    return [[x * factors.get(k, default) for x in samples] for k, samples in enumerate(run)]


def test_a_whole_run_ten_times_slower_is_news_not_noise():
    rng = random.Random(5)
    base = [math.exp(rng.uniform(math.log(0.05), math.log(5))) for _ in range(12)]
    a = fake_run(rng, base, 15, GPU)
    b = _scaled(fake_run(rng, base, 15, GPU), {}, 10.0)
    d = diff_reports(_record(a), _record(b))
    text = render_diff(d)
    assert 8 < d.shift < 12 and d.significant_timings == []
    assert "THE WHOLE RUN CHANGED" in text and "x slower)" in text, text
    assert "no piece changed beyond noise relative to that shift" in text
    assert "no timing change" not in text


def test_a_piece_judged_against_the_shift_says_so_where_its_own_ratio_reads_otherwise():
    """Every piece 2.5x faster in B but one, only 1.6x faster: that one is slower than the run as a whole, and its
    line says so beside its own ratio below 1 (the words and the ratio do not contradict each other)."""
    rng = random.Random(7)
    base = [math.exp(rng.uniform(math.log(0.05), math.log(5))) for _ in range(12)]
    a = fake_run(rng, base, 20, GPU)
    b = _scaled(fake_run(rng, base, 20, GPU), {4: 1 / 1.6}, 1 / 2.5)
    d = diff_reports(_record(a), _record(b))
    [flagged] = d.significant_timings
    assert flagged.path == "graph0/thunder_4" and flagged.change.verdict is ChangeOutcome.SLOWER
    assert flagged.change.ratio < 1
    line = next(line for line in render_diff(d).splitlines() if "graph0/thunder_4 forward" in line)
    assert "SLOWER THAN THE RUN AS A WHOLE" in line and "x the run-wide shift of 0.4" in line, line
    assert "B 2.5x faster" in render_diff(d)


def test_a_short_run_says_nothing_could_be_judged_and_why():
    rng = random.Random(3)
    base = [1.0, 2.0, 3.0]
    a, b = fake_run(rng, base, 3, GPU), _scaled(fake_run(rng, base, 3, GPU), {}, 4.0)
    text = render_diff(diff_reports(_record(a), _record(b)))
    assert "no piece could be judged" in text and "no piece had the samples to tell" in text, text
    assert "beyond noise" not in text.split("Beyond noise means")[0]
    assert "sample more often, THUNDERFX_DEBUG_TIMING_EVERY, or train longer" in text


def test_a_resolution_beyond_belief_is_not_printed_as_a_figure():
    a = [[1.0, 50.0, 0.02, 3.0, 900.0, 0.5]] * 10
    b = [[0.5, 40.0, 0.05, 200.0, 1.0, 7.0]] * 10
    text = render_diff(diff_reports(_record(a), _record(b)), show_all=True)
    assert "could not tell a 100x change from noise" in text and "could tell 4" not in text
