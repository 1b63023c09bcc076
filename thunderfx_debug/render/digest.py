"""Facts derived from a RankRecord that every renderer shows: grouped split reasons, recompiles, the training steps,
the timed pieces with their share of the time in the compiled graphs, and how ranks compare. Pure functions of
records, no I/O.

Time per step. A piece's time per step is its headline median (see `headline`: the first sampled call and disturbed
calls left out) times its graph's calls per step: the graph's calls over the run's training steps (`steps`). Those
are the steps torch's optimizers counted (`records.Steps`) where the run stepped one; else they are estimated, and
every figure per step says so: as the calls of the first compiled Dynamo frame (its graphs and their recompiles
together; the usual training loop calls the model once per step), not those of the least-called graph, which a
recompile for a rare branch, an evaluation graph or a logging graph would make far fewer. Medians, not means: one
outlier (a late compile, a preempted call) would otherwise decide the ranking. The time in the compiled graphs per
step is the sum of the graphs' times per step, so the shares of pieces that nest (fusions in splits in graphs) come
out close to, not exactly, their part of 100%. It is not the step: eager code between graphs, the optimizer and data
loading lie outside every graph; the step's wall time is `accounting.step_account`'s.
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from thunderfx_debug.records import ClockKind, GraphRecord, Phase, RankRecord, SplitKind, SplitReason, Timing
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render.headline import Headline, headline, left_out_calls, thinnest
from thunderfx_debug.render.text import plural


@dataclasses.dataclass(frozen=True)
class ReasonGroup:
    """Split reasons of one type and op, with where they occurred (`places`: "graph0/inductor_1", ...)."""

    type: str
    op: str
    count: int
    places: tuple[str, ...]
    exceptions: tuple[str, ...]  # distinct last lines of the exceptions thunder caught, for the reader


def reason_op(reason: SplitReason) -> str:
    """The op a reason is about: the recorded op, else the start of thunder's message."""
    return reason.op or reason.info.split(",")[0].strip() or "?"


def group_reasons(report_or_graphs: RankRecord | Iterable[GraphRecord]) -> list[ReasonGroup]:
    """Split reasons grouped by (type, op), most frequent first, then by type and op name."""
    graphs = report_or_graphs.graphs if isinstance(report_or_graphs, RankRecord) else report_or_graphs
    places: dict[tuple[str, str], list[str]] = defaultdict(list)
    exceptions: dict[tuple[str, str], list[str]] = defaultdict(list)
    for graph in graphs:
        located = [(PieceKey.of(graph.name, s.name), r) for s in graph.splits for r in s.reasons]
        located += [(graph.name, r) for r in graph.unattributed_reasons]
        for place, reason in located:
            key = (reason.type, reason_op(reason))
            places[key].append(place)
            if reason.exception and reason.exception.strip():
                last = reason.exception.strip().splitlines()[-1][:200]
                if last not in exceptions[key]:
                    exceptions[key].append(last)
    groups = [ReasonGroup(t, op, len(p), tuple(p), tuple(exceptions[(t, op)])) for (t, op), p in places.items()]
    return sorted(groups, key=lambda g: (-g.count, g.type, g.op))


def recompiled_frames(report: RankRecord) -> dict[str, list[GraphRecord]]:
    """Dynamo frames compiled more than once ("0" -> the first graph of each of its compile ids 0/0, 0/1, ...).
    Graphs that share a compile id are one compile: DDP's optimizer hands the backend one graph per bucket."""
    frames: dict[str, dict[str, GraphRecord]] = defaultdict(dict)
    for graph in report.graphs:
        if graph.compile_id:
            frames[graph.compile_id.split("/")[0]].setdefault(graph.compile_id, graph)
    return {frame: list(graphs.values()) for frame, graphs in frames.items() if len(graphs) > 1}


@dataclasses.dataclass(frozen=True)
class StepCount:
    """The run's training steps and how they are known: `counted` by torch's optimizers (`records.Steps`), else
    estimated as the calls of the graphs of Dynamo frame `frame` (see the module docstring); `count` None where no
    graph ran."""

    count: int | None
    counted: bool
    frame: str | None = None
    graphs: tuple[str, ...] = ()  # the graphs whose calls stand for the steps, where estimated

    def per_step(self, graph: GraphRecord) -> float:
        """How often `graph` runs in a step (1 where neither is known)."""
        return graph.calls / self.count if self.count and graph.calls else 1.0

    def describe(self) -> str:
        """"12 optimizer steps", or what the estimate rests on, said as an estimate."""
        if self.counted:
            return plural(self.count or 0, "optimizer step")
        if self.count is None:
            return "steps not known (no graph ran)"
        where = f"Dynamo frame {self.frame}" if self.frame is not None else "the first graph"
        return (f"steps not counted (no torch.optim optimizer stepped): {self.count} estimated as the calls of "
                f"{where} ({', '.join(self.graphs)})")


def steps(report: RankRecord) -> StepCount:
    """The run's training steps (see the module docstring)."""
    counted = report.steps
    if counted is not None and counted.count > 0:
        return StepCount(counted.count, True)
    ran = [g for g in report.graphs if g.calls > 0]
    if not ran:
        return StepCount(None, False)
    first = ran[0]
    if not first.compile_id:
        return StepCount(first.calls, False, None, (first.name,))
    frame = first.compile_id.split("/")[0]
    by_compile: dict[str, GraphRecord] = {}
    for graph in ran:  # graphs of one compile (DDP's buckets) run together: one call of the frame
        if graph.compile_id and graph.compile_id.split("/")[0] == frame:
            if graph.compile_id not in by_compile or graph.calls > by_compile[graph.compile_id].calls:
                by_compile[graph.compile_id] = graph
    chosen = sorted(by_compile.values(), key=lambda g: g.index)
    return StepCount(sum(g.calls for g in chosen), False, frame, tuple(g.name for g in chosen))


class PieceLevel(str, enum.Enum):
    """What a timed piece is: a graph, a split, a fusion region, or a split's time outside its fusion regions."""

    GRAPH = "graph"
    SPLIT = "split"
    FUSION = "fusion"
    OUTSIDE_FUSIONS = "outside fusions"
    OP_GROUP = "op group"  # a split's ops of one symbol and executor outside its fusion regions (`records.OpGroup`)


@dataclasses.dataclass(frozen=True)
class TimedPiece:
    """A timed piece of the run, flattened: a graph, a split, a fusion region or a split's time outside fusions,
    in one phase. `path` names it ("graph0/thunder_0/nvFusion0"), `executor` is what ran it (thunder, inductor,
    nvfuser, torchcompile, ...), `calls_per_step` how often it runs in a step, `sources` the lines of the model's
    code its ops came from (splits, regions and op groups), `reads_saved_from` those of the forward that made the
    saved values it reads (backward regions and op groups)."""

    level: PieceLevel
    graph: str
    split: str | None
    name: str
    phase: str
    executor: str
    timing: Timing
    calls_per_step: float
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    headline: Headline | None = None  # computed from `timing` where not given (see `headline`)
    count: int = 0  # how many ops an op group has
    sources: tuple[str, ...] = ()
    reads_saved_from: tuple[str, ...] = ()

    def __post_init__(self):
        if self.headline is None:
            object.__setattr__(self, "headline", headline(self.timing))

    @property
    def path(self) -> str:
        named = self.level in (PieceLevel.FUSION, PieceLevel.OP_GROUP)
        return "/".join(p for p in (self.graph, self.split, self.name if named else None) if p)

    @property
    def label(self) -> str:
        suffix = " (outside fusions)" if self.level is PieceLevel.OUTSIDE_FUSIONS else ""
        if self.level is PieceLevel.OP_GROUP:
            suffix = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.path} {self.phase}{suffix}"

    @property
    def median_ms(self) -> float | None:
        """The headline median (see `headline`)."""
        return self.headline.median_ms

    @property
    def ms_per_step(self) -> float:
        return (self.headline.median_ms or 0.0) * self.calls_per_step


def outside_phase(key: str) -> str:
    """The phase of an `outside_fusions_timing` key: the recorder writes "outside_forward", "outside_backward"."""
    return key.removeprefix("outside_")


def timed_pieces(report: RankRecord) -> list[TimedPiece]:
    """Every piece of `report` that has timing samples, in report order."""
    count = steps(report)
    pieces: list[TimedPiece] = []
    for graph in report.graphs:
        per_step = count.per_step(graph)
        left_out = left_out_calls(graph)

        def add(level, split, name, phase, executor, timing, files=None, count=0, sources=(), saved=()):
            if timing is not None and timing.count:
                pieces.append(TimedPiece(level, graph.name, split, name, phase, executor, timing, per_step,
                                         files or {}, headline(timing, left_out), count, sources, saved))

        add(PieceLevel.GRAPH, None, graph.name, "forward", "thunderfx", graph.timing, graph.files)
        add(PieceLevel.GRAPH, None, graph.name, "backward", "thunderfx", graph.backward_timing, graph.files)
        for split in graph.splits:
            executor = split.kind.value
            add(PieceLevel.SPLIT, split.name, split.name, "forward", executor, split.timing, split.files,
                sources=split.sources)
            add(PieceLevel.SPLIT, split.name, split.name, "backward", executor, split.backward_timing, split.files,
                sources=split.sources)
            for fusion in split.fusions:
                add(PieceLevel.FUSION, split.name, fusion.name, fusion.phase.value, fusion.executor, fusion.timing,
                    fusion.files, sources=fusion.sources, saved=fusion.reads_saved_from)
            for key, timing in sorted(split.outside_fusions_timing.items()):
                add(PieceLevel.OUTSIDE_FUSIONS, split.name, split.name, outside_phase(key), executor, timing)
            for group in split.op_groups:
                add(PieceLevel.OP_GROUP, split.name, group.label, group.phase.value, group.executor, group.timing,
                    count=group.count, sources=group.sources, saved=group.reads_saved_from)
    return pieces


def compiled_ms_per_step(report: RankRecord) -> float | None:
    """The time in the compiled graphs per training step, on `clock(report)`: the graphs' forward and backward
    headline medians times their calls per step (see the module docstring: not the step's wall time)."""
    graphs = [p for p in timed_pieces(report) if p.level is PieceLevel.GRAPH]
    return sum(p.ms_per_step for p in graphs) if graphs else None


def compiled_samples_flag(report: RankRecord) -> str | None:
    """"too few samples (n)" where `compiled_ms_per_step` rests on a graph median of too few samples, else None."""
    return thinnest(p.headline for p in timed_pieces(report) if p.level is PieceLevel.GRAPH)


def top_regions(report: RankRecord, limit: int = 10) -> list[tuple[TimedPiece, float | None]]:
    """The costliest regions with their share of the time in the compiled graphs per step (None without graph timing):
    fusion regions and the time
    outside them where fusions were timed (by op group where the ops were marked), plus inductor splits; thunder
    splits where fusions were not timed."""
    pieces = timed_pieces(report)
    in_regions = (PieceLevel.FUSION, PieceLevel.OUTSIDE_FUSIONS, PieceLevel.OP_GROUP)
    fused_splits = {(p.graph, p.split) for p in pieces if p.level in in_regions}
    by_op = {(p.graph, p.split, p.phase) for p in pieces if p.level is PieceLevel.OP_GROUP}
    regions = []
    for p in pieces:
        if p.level is PieceLevel.OUTSIDE_FUSIONS and (p.graph, p.split, p.phase) in by_op:
            continue  # its op groups stand for it
        if p.level in in_regions or (p.level is PieceLevel.SPLIT and (p.graph, p.split) not in fused_splits):
            regions.append(p)
    compiled = compiled_ms_per_step(report)
    regions.sort(key=lambda p: -p.ms_per_step)
    return [(p, p.ms_per_step / compiled if compiled else None) for p in regions[:limit]]


def clock(report: RankRecord) -> ClockKind | None:
    """The clock of the report's samples, None when nothing was timed."""
    clocks = Counter(p.timing.clock for p in timed_pieces(report))
    return clocks.most_common(1)[0][0] if clocks else None


def time_word(kind: ClockKind | None) -> str:
    """What a clock measures, for the words beside its figures: "device" (CUDA events) or "host" (perf_counter)."""
    return "device" if kind is ClockKind.CUDA else "host"


def counts(report: RankRecord) -> dict[str, int]:
    splits = [s for g in report.graphs for s in g.splits]
    return {
        "graphs": len(report.graphs),
        "thunder splits": sum(s.kind is SplitKind.THUNDER for s in splits),
        "inductor splits": sum(s.kind is SplitKind.INDUCTOR for s in splits),
        "forward fusions": sum(len(s.fusions_in(Phase.FORWARD)) for s in splits),
        "backward fusions": sum(len(s.fusions_in(Phase.BACKWARD)) for s in splits),
        "split reasons": sum(len(g.reasons) for g in report.graphs),
        "recompiles": sum(len(g) - 1 for g in recompiled_frames(report).values()),
        "errors": sum(bool(g.error) for g in report.graphs) + sum(bool(s.error) for s in splits),
    }


def structure(report: RankRecord) -> tuple:
    """What ThunderFX made of the run, without timings: equal for ranks that split and fused alike."""
    return tuple(
        (g.name, tuple((s.name, tuple(sorted(Counter((f.executor, f.phase.value) for f in s.fusions).items())))
                       for s in g.splits))
        for g in report.graphs
    )


@dataclasses.dataclass(frozen=True)
class RankRow:
    rank: int
    counts: dict[str, int]
    compiled_ms: float | None  # the time in its compiled graphs per step (`compiled_ms_per_step`)
    straggler: bool  # compiled time per step beyond STRAGGLER_FACTOR x the ranks' median
    splits_differently: bool  # graphs, splits or fusions differ from those of most ranks


STRAGGLER_FACTOR = 1.10


def compare_ranks(reports: Mapping[int, RankRecord]) -> list[RankRow]:
    """One row per rank; flags the ranks that are slower than the others or split differently.

    A rank is a straggler when its time in the compiled graphs per step is more than 10% above the median over ranks;
    it splits differently when its structure (graphs, splits, fusion counts) is not the one most ranks share.
    """
    compiled = {rank: compiled_ms_per_step(report) for rank, report in reports.items()}
    known = [s for s in compiled.values() if s is not None]
    median = statistics.median(known) if len(known) > 1 else None
    shapes = {rank: structure(report) for rank, report in reports.items()}
    common, _ = Counter(shapes.values()).most_common(1)[0]
    return [
        RankRow(
            rank=rank,
            counts=counts(report),
            compiled_ms=compiled[rank],
            straggler=bool(median and compiled[rank] is not None and compiled[rank] > STRAGGLER_FACTOR * median),
            splits_differently=len(reports) > 1 and shapes[rank] != common,
        )
        for rank, report in reports.items()
    ]


def timing_passed_over(graph: GraphRecord) -> str | None:
    """What the summary and the page say of the sampled calls THUNDERFX_DEBUG_TIMING_SHARE passed over (None: none)."""
    if not graph.timing_passed_over:
        return None
    return (f"timing: {plural(graph.timing_passed_over, 'sampled call')} passed over, to keep timing within "
            "THUNDERFX_DEBUG_TIMING_SHARE (its samples, and its splits' and regions', come from the others)")
