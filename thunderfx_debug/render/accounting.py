"""Where the time went, as pure functions of records: the first step (compile cost as felt), a training step's wall
time against the device's busy time, the pieces whose host time dominates, and a thunder split's time accounted for
region by region and op group by op group.

First step. The window runs from the start of the first graph's compile (Dynamo's compile of its frame) to the end
of the first backward of every graph whose compile started before that graph's first backward ended (the graphs of
the first step; later graphs, an evaluation graph say, are compiled in later steps). Its parts are the graphs' and
splits' `records.CompileCost` parts; "other" is what is left of the window: eager code between graphs, Dynamo's
guards, the autograd engine, the graphs' own glue. The optimizer step and data loading of the first step come after
the window and are not in it.

Step. The wall time is the host's: where torch's optimizers counted the steps (`records.Steps`), the headline median
of the host wall time from one optimizer step to the next, over every step of the run (not only the sampled ones),
those during which the process compiled left out; the training loop's own clock measures the same. Without an
optimizer, it is estimated from the headline median of `GraphRecord.period_timing` (from the start of a sampled call
to the start of the next call) of the most-called graph of the frame whose calls stand for the steps
(`digest.steps`), scaled by its calls per step, and says so; that one includes the sampling's own host cost on those
calls. The busy time is the time in the compiled graphs per step (`digest.compiled_ms_per_step`): CUDA events from
the start to the end of each graph's forward and backward. It includes the device's waits for the host inside a
graph (except behind the device hold of fusion-level timing) and the events' own cost, so it is an upper bound of
the time the device works, and the idle share (1 - busy / wall) a lower bound. Not in "busy": eager code between
graphs, the optimizer, data loading, anything else the step runs on the device outside the graphs. On CPU runs
device time is host time: there the figure is the share of the step spent in compiled graphs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from thunderfx_debug.records import ClockKind, CostStage, GraphRecord, Phase, RankRecord, SplitKind, SplitRecord, Timing
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest
from thunderfx_debug.render.headline import Headline, headline, left_out_calls, thinnest

#: A step whose device idles at least this share of its wall time is called host-bound.
HOST_BOUND_IDLE = 0.30

#: How the summary names each part of a compile cost.
STAGE_WORDS = {
    CostStage.DYNAMO: "Dynamo",
    CostStage.BACKEND: "backend call (ThunderFX splitting)",
    CostStage.THUNDER_TRACING: "Thunder tracing",
    CostStage.THUNDER_TRANSFORMS: "Thunder transforms",
    CostStage.KERNEL_COMPILES: "kernel compiles seen by Dynamo (torch.compile, inductor backward)",
    CostStage.INDUCTOR_COMPILE: "inductor compiling its splits",
    CostStage.FIRST_EXECUTION: "first executions",
}


def stage_words(stage: CostStage, kind: ClockKind | None) -> str:
    """How the summary names a part; on CUDA runs, first executions are where nvFuser compiles (unseen on its own)."""
    words = STAGE_WORDS[stage]
    if stage is CostStage.FIRST_EXECUTION and kind is ClockKind.CUDA:
        words += " (nvFuser compiles its fusions in them)"
    return words


@dataclasses.dataclass(frozen=True)
class FirstStep:
    """The first step's compile cost: `seconds` of host wall time over `graphs`, `parts` by stage, `other_s` the
    rest of the window."""

    seconds: float
    graphs: tuple[str, ...]
    parts: dict[CostStage, float]
    other_s: float


def first_step(report: RankRecord) -> FirstStep | None:
    """See the module docstring; None where no graph has a compile cost (timing off, or an old dump)."""
    costs = [(g, g.compile_cost) for g in report.graphs
             if g.compile_cost is not None and g.compile_cost.started_s is not None]
    if not costs:
        return None
    costs.sort(key=lambda item: item[1].started_s)
    first_end = costs[0][1].ended_s or costs[0][1].started_s
    chosen = [(g, c) for g, c in costs if c.started_s <= first_end]
    start = chosen[0][1].started_s
    end = max((c.ended_s or c.started_s) for _, c in chosen)
    parts: dict[CostStage, float] = defaultdict(float)
    for graph, cost in chosen:
        for part in cost.parts:
            parts[part.what] += part.seconds
        for split in graph.splits:
            if split.compile_cost is not None:
                for part in split.compile_cost.parts:
                    parts[part.what] += part.seconds
    seconds = max(end - start, 0.0)
    ordered = dict(sorted(parts.items(), key=lambda item: -item[1]))
    return FirstStep(seconds, tuple(g.name for g, _ in chosen), ordered, max(seconds - sum(ordered.values()), 0.0))


@dataclasses.dataclass(frozen=True)
class HostPiece:
    """A graph's or split's phase on CUDA: its host wall time and device time per step (headline medians, ms)."""

    label: str
    host_ms: float
    device_ms: float
    thunder_ms: float | None = None  # Thunder's own host time in it (thunder splits' forward)


@dataclasses.dataclass(frozen=True)
class StepAccount:
    """A training step: `wall_ms` (host) against `busy_ms` (the graphs' time per step on `clock`); see the module
    docstring for what each covers. `steps` is how many there were and how that is known; `wall_graph` the graph
    whose periods estimate the wall time, None where the optimizer's steps measured it. `host_pieces` are the pieces
    whose host time exceeds their device time, most host time per step first (CUDA runs). `wall_flag` and
    `busy_flag` are "too few samples (n)" where the figure rests on too few headline samples (a short run, or one
    sampled rarely), to be said next to the number."""

    clock: ClockKind
    wall_ms: float | None
    busy_ms: float | None
    wall_graph: str | None
    host_pieces: tuple[HostPiece, ...] = ()
    wall_flag: str | None = None
    busy_flag: str | None = None
    steps: digest.StepCount = digest.StepCount(None, False)

    @property
    def wall_source(self) -> str:
        """Where the wall time comes from, for the words beside it."""
        if self.wall_graph is None:
            return f"between the optimizer's steps, {self.steps.describe()}"
        return f"from {self.wall_graph}'s sampled calls; {self.steps.describe()}"

    @property
    def busy_share(self) -> float | None:
        if not self.wall_ms or self.busy_ms is None:
            return None
        return min(self.busy_ms / self.wall_ms, 1.0)

    @property
    def idle_share(self) -> float | None:
        """At least this share of the step the device idles (CUDA); None on CPU runs or without a wall time."""
        share = self.busy_share
        return None if share is None or self.clock is not ClockKind.CUDA else 1.0 - share

    @property
    def host_bound(self) -> bool:
        return self.idle_share is not None and self.idle_share >= HOST_BOUND_IDLE


def _median(timing: Timing | None, left_out) -> float | None:
    return None if timing is None or not timing.count else headline(timing, left_out).median_ms


def _host_pieces(report: RankRecord) -> tuple[HostPiece, ...]:
    steps = digest.steps(report)
    pieces = []
    for graph in report.graphs:
        per_step = steps.per_step(graph)
        left_out = left_out_calls(graph)
        owners = [(graph.name, graph, None)] + [(PieceKey.of(graph.name, s.name), s, s) for s in graph.splits]
        for name, owner, split in owners:
            for phase, host, device in (("forward", owner.host_timing, owner.timing),
                                        ("backward", owner.host_backward_timing, owner.backward_timing)):
                host_ms, device_ms = _median(host, left_out), _median(device, left_out)
                if host_ms is None or device_ms is None or host_ms <= device_ms:
                    continue
                thunder = None
                if split is not None and phase == "forward" and split.thunder_overhead_timing is not None:
                    thunder = (_median(split.thunder_overhead_timing, left_out) or 0.0) * per_step
                pieces.append(HostPiece(f"{name} {phase}", host_ms * per_step, device_ms * per_step, thunder))
    # Graphs contain their splits: a graph is listed, then the splits whose host time makes most of it.
    return tuple(sorted(pieces, key=lambda p: -p.host_ms))


def step_account(report: RankRecord) -> StepAccount | None:
    """See the module docstring; None where nothing was timed."""
    kind = digest.clock(report)
    if kind is None:
        return None
    busy = digest.compiled_ms_per_step(report)
    steps = digest.steps(report)
    wall, wall_graph, wall_flag = None, None, None
    counted = report.steps
    if steps.counted and counted.period is not None and counted.period.count:
        period = headline(counted.period)
        wall, wall_flag = period.median_ms, thinnest([period])
    else:
        stand_ins = set(steps.graphs) or {g.name for g in report.graphs}
        timed = [g for g in report.graphs if g.name in stand_ins and g.period_timing is not None
                 and g.period_timing.count]
        if timed:
            graph = max(timed, key=lambda g: (g.calls, -g.index))
            period = headline(graph.period_timing, left_out_calls(graph))
            wall, wall_graph, wall_flag = period.median_ms, graph.name, thinnest([period])
            wall *= steps.per_step(graph)
    return StepAccount(kind, wall, busy, wall_graph, _host_pieces(report) if kind is ClockKind.CUDA else (),
                       wall_flag, digest.compiled_samples_flag(report), steps)


def wall_step_ms(report: RankRecord) -> float | None:
    """The step's wall time (host clock) where it was measured, else None."""
    account = step_account(report)
    return account.wall_ms if account is not None else None


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of a split's time in a phase: a fusion region, an op group, or what lies outside its trace."""

    label: str
    executor: str
    headline: Headline
    count: int = 0

    @property
    def median_ms(self) -> float:
        return self.headline.median_ms or 0.0


#: The part of a split's time outside its Thunder trace: Thunder's cache check and prologue before it, the autograd
#: connection and epilogue after it (forward), the autograd engine's work around the backward trace.
OUTSIDE_TRACE = "Thunder outside its trace"


def _by_call(timing: Timing | None) -> dict[int, float]:
    if timing is None:
        return {}
    return dict(zip(timing.calls, timing.samples_ms))


def split_parts(graph: GraphRecord, split: SplitRecord, phase: Phase) -> tuple[Timing | None, list[Part]]:
    """A thunder split's time in `phase` (its timing) and the parts it is accounted for by: its fusion regions, its
    op groups (or its time outside fusions, where the ops were not marked), and `OUTSIDE_TRACE`: per sampled call,
    the split's time less its trace's (regions and outside), where both were sampled on the same calls."""
    total = split.timing if phase is Phase.FORWARD else split.backward_timing
    if split.kind is not SplitKind.THUNDER or total is None:
        return total, []
    left_out = left_out_calls(graph)
    parts = [Part(f.name, f.executor, headline(f.timing, left_out)) for f in split.fusions_in(phase)
             if f.timing is not None and f.timing.count]
    groups = [g for g in split.op_groups if g.phase is phase and g.timing is not None and g.timing.count]
    outside = split.outside_fusions_timing.get(f"outside_{phase.value}")
    if groups:
        parts += [Part(g.label, g.executor, headline(g.timing, left_out), g.count) for g in groups]
    elif outside is not None and outside.count:
        parts.append(Part("outside fusions", "thunder", headline(outside, left_out)))
    if outside is not None:
        in_trace: dict[int, float] = defaultdict(float)
        for timing in [f.timing for f in split.fusions_in(phase)] + [outside]:
            for call, ms in _by_call(timing).items():
                in_trace[call] += ms
        calls = [c for c in total.calls if c in in_trace]
        if calls:
            rest = Timing(tuple(max(_by_call(total)[c] - in_trace[c], 0.0) for c in calls), tuple(calls), total.clock)
            parts.append(Part(OUTSIDE_TRACE, "thunder", headline(rest, left_out)))
    parts.sort(key=lambda p: -p.median_ms)
    return total, parts


def accounted_share(total: Timing, parts: list[Part], graph: GraphRecord) -> float | None:
    """How much of the split's headline median its parts' headline medians add up to (medians do not add exactly)."""
    whole = headline(total, left_out_calls(graph)).median_ms
    return sum(p.median_ms for p in parts) / whole if whole else None

