"""The ranks of a multi-rank dump side by side (the straggler view): each rank's step, the spread between ranks, the
slowest rank's slowest pieces against the same pieces on the other ranks, and the collectives the records can tell
apart. Pure functions of records, no I/O; `summary.render_ranks` and `html` render them.

A rank's compiled step is the time in its compiled graphs per step (`digest.compiled_ms_per_step`: the graphs'
forward and backward medians times calls per step), on the clock that measured it (CUDA events, or the host clock on
CPU runs); its step's wall time (host clock) stands beside it where it was measured.

Collectives. Where a collective is an op of a compiled graph, the records show it: an FX op of a split (ThunderFX
sends the ops Thunder does not support, such as `torch.ops._c10d_functional.*`, to inductor, so an inductor split
holds them), or a symbol of a fusion region in a Thunder trace. The collectives of DDP and FSDP2 usually run outside
every graph: DDP's bucket all-reduces in its autograd hooks, FSDP2's all-gathers and reduce-scatters in its module
hooks. Those are not in any figure of the graphs; what they cost a compiled piece by running beside it (contention
for the device or the cores) is, without being told apart.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Mapping

from thunderfx_debug.records import ClockKind, RankRecord, SplitKind
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest
from thunderfx_debug.render.accounting import step_account
from thunderfx_debug.render.digest import PieceLevel, TimedPiece

#: Op and symbol names that are collectives: torch.distributed's (c10d, functional collectives, DTensor's and FSDP's
#: ops) and Thunder's distributed prims.
#: Whole words only: `broadcast_in_dim` (a Thunder prim in every trace) is no collective.
_COLLECTIVE = re.compile(
    r"c10d|\b(all_reduce|allreduce|all_gather(_into_tensor)?|allgather|reduce_scatter(_tensor)?|reducescatter"
    r"|all_to_all(_single)?|alltoall|broadcast|wait_tensor)\b|torch\.distributed\.|\bfsdp\.", re.IGNORECASE)


def is_collective(op: str) -> bool:
    """Whether an op (FX op name, Thunder symbol) is a collective or waits for one.

    Example:
        >>> [is_collective(op) for op in ("torch.ops._c10d_functional.all_gather_into_tensor.default", "all_reduce",
        ...                                 "torch.ops.fsdp.all_gather_copy_in.default", "broadcast_in_dim", "matmul")]
        [True, True, True, False, False]
    """
    return bool(_COLLECTIVE.search(op))


@dataclasses.dataclass(frozen=True)
class RankStep:
    """One rank's step: `compiled_ms` its compiled time per step (see the module docstring), on `clock`;
    `collective_ms` the time per step of the pieces that hold collectives (None where none was timed); `wall_ms` the
    step's wall time on the host clock (the period between sampled calls of a graph, see `render.accounting`; None
    where no period was timed), which also holds what runs outside the graphs (eager code, the optimizer, waiting
    in collectives)."""

    rank: int
    compiled_ms: float | None
    clock: ClockKind | None
    collective_ms: float | None
    wall_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Spread:
    """How far apart the ranks' steps are: the slowest and fastest rank, the median over ranks, and the slowest
    rank's excess over the median of the other ranks (ms per step)."""

    slowest: int
    fastest: int
    slowest_ms: float
    fastest_ms: float
    median_ms: float
    excess_ms: float

    @property
    def ratio(self) -> float:
        """Slowest over fastest step."""
        return self.slowest_ms / self.fastest_ms if self.fastest_ms > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class PieceAcrossRanks:
    """One piece of the slowest rank with the same piece on every rank (`ms_per_step`, None where a rank has no
    such piece or did not time it); `excess_ms` is the slowest rank's figure minus the median of the others'."""

    label: str
    executor: str
    ms_per_step: Mapping[int, float | None]
    excess_ms: float | None


def _key(piece: TimedPiece) -> tuple:
    return (piece.level, piece.graph, piece.split, piece.name, piece.phase)


def _regions(report: RankRecord) -> dict[tuple, TimedPiece]:
    """The pieces that do not nest in one another (`digest.top_regions`: fusion regions, the time outside them,
    inductor splits, thunder splits without timed regions), by key."""
    return {_key(p): p for p, _ in digest.top_regions(report, limit=10**9)}


def collective_pieces(report: RankRecord) -> list[TimedPiece]:
    """The timed pieces that hold a collective: splits with a collective among their FX ops, fusion regions with one
    among their symbols. A split is counted whole (its other ops too); a thunder split with timed fusion regions is
    counted by those regions that hold one."""
    pieces = digest.timed_pieces(report)
    holding: set[tuple] = set()
    for graph in report.graphs:
        for split in graph.splits:
            if any(is_collective(op) for op in split.ops):
                holding.add((graph.name, split.name, None))
            for fusion in split.fusions:
                if any(is_collective(op) for op in fusion.ops):
                    holding.add((graph.name, split.name, fusion.name))
    regions = set(_regions(report))
    chosen = []
    for p in pieces:
        if _key(p) not in regions:
            continue
        if p.level is PieceLevel.FUSION and (p.graph, p.split, p.name) in holding:
            chosen.append(p)
        elif p.level is PieceLevel.SPLIT and (p.graph, p.split, None) in holding:
            chosen.append(p)
    return chosen


@dataclasses.dataclass(frozen=True)
class CollectivePlace:
    """Where collectives appear in a rank's graphs: `place` ("graph0/inductor_1", "graph0/thunder_0/nvFusion2"),
    `kind` (SplitKind value, or "fusion region"), and the collective ops there."""

    place: str
    kind: str
    ops: tuple[str, ...]


def collective_places(report: RankRecord) -> list[CollectivePlace]:
    """Every split and fusion region of the report with a collective among its ops, timed or not."""
    places = []
    for graph in report.graphs:
        for split in graph.splits:
            ops = tuple(dict.fromkeys(op for op in split.ops if is_collective(op)))
            if ops:
                places.append(CollectivePlace(PieceKey.of(graph.name, split.name), split.kind.value, ops))
            for fusion in split.fusions:
                ops = tuple(dict.fromkeys(op for op in fusion.ops if is_collective(op)))
                if ops:
                    places.append(CollectivePlace(f"{graph.name}/{split.name}/{fusion.name} {fusion.phase.value}",
                                                  "fusion region", ops))
    return places


def ddp_buckets(report: RankRecord) -> dict[str, list[str]]:
    """Compile id -> the graphs DDP's optimizer split that compile into (one per gradient bucket): the graphs of one
    compile id that Dynamo ended with DDPOptimizer's graph break. Empty without DDP (or with DDP's optimizer off).

    Example:
        >>> from thunderfx_debug.records import GraphRecord
        >>> brk = "DDPOptimizer intentional graph-break (See Note [DDPOptimizer])"
        >>> graphs = [GraphRecord(f"graph{i}", i, compile_id="0/0", break_reason=brk) for i in range(2)]
        >>> ddp_buckets(RankRecord(graphs=tuple(graphs)))
        {'0/0': ['graph0', 'graph1']}
    """
    by_compile: dict[str, list[str]] = {}
    for graph in report.graphs:
        if graph.compile_id and "DDPOptimizer" in (graph.break_reason or ""):
            by_compile.setdefault(graph.compile_id, []).append(graph.name)
    # The last bucket's graph ends with the frame, not with DDPOptimizer's break: it shares the compile id.
    for graph in report.graphs:
        names = by_compile.get(graph.compile_id or "")
        if names is not None and graph.name not in names:
            names.append(graph.name)
    return by_compile


def clock_words(clock: ClockKind) -> str:
    """What a clock measures, in the words the figures are labelled with."""
    return "device time, CUDA events" if clock is ClockKind.CUDA else "host clock"


def rank_steps(reports: Mapping[int, RankRecord]) -> list[RankStep]:
    steps = []
    for rank, report in reports.items():
        collectives = collective_pieces(report)
        account = step_account(report)
        steps.append(RankStep(
            rank=rank,
            compiled_ms=digest.compiled_ms_per_step(report),
            clock=digest.clock(report),
            collective_ms=sum(p.ms_per_step for p in collectives) if collectives else None,
            wall_ms=account.wall_ms if account is not None else None,
        ))
    return steps


def late_outside_graphs(steps: list[RankStep], lags: ArrivalLags | None) -> str | None:
    """A sentence where the rank that enqueues the collectives latest is not the rank with the longest compiled step:
    the straggler loses its time outside the compiled graphs, which the compiled figures do not hold (None where the
    two agree, or either is unknown).

    Example (rank 1's compiled step is shorter, yet it is late at every collective):
        >>> steps = [RankStep(0, 8.2, ClockKind.HOST, None, 56.0), RankStep(1, 6.9, ClockKind.HOST, None, 85.3)]
        >>> lags = ArrivalLags(20, 60.0, {0: 3, 1: 17}, {0: 0.0, 1: 29.9}, {0: 20.6, 1: 21946.9}, True)
        >>> print(late_outside_graphs(steps, lags))
        rank 1 enqueued the collectives latest (median 29.900 ms behind the first rank), though rank 0 has the longest compiled step: rank 1 loses its time outside the compiled graphs (eager code, the optimizer, data, other threads); its step's wall time is 85.300 ms, the others' median 56.000 ms
    """
    slowest = spread(steps)
    if slowest is None or lags is None:
        return None
    late = lags.latest
    if late is None or late == slowest.slowest:
        return None
    text = (f"rank {late} enqueued the collectives latest (median {lags.median_lag_ms[late]:.3f} ms behind the first "
            f"rank), though rank {slowest.slowest} has the longest compiled step: rank {late} loses its time outside "
            "the compiled graphs (eager code, the optimizer, data, other threads)")
    walls = {s.rank: s.wall_ms for s in steps if s.wall_ms is not None}
    if late in walls and len(walls) > 1:
        others = statistics.median(ms for r, ms in walls.items() if r != late)
        text += f"; its step's wall time is {walls[late]:.3f} ms, the others' median {others:.3f} ms"
    return text


def spread(steps: list[RankStep]) -> Spread | None:
    """The spread of the ranks' compiled step (None with fewer than two ranks timed)."""
    timed = {s.rank: s.compiled_ms for s in steps if s.compiled_ms is not None}
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda r: (timed[r], -r))
    fastest = min(timed, key=lambda r: (timed[r], r))
    others = [ms for r, ms in timed.items() if r != slowest]
    return Spread(slowest, fastest, timed[slowest], timed[fastest], statistics.median(timed.values()),
                  timed[slowest] - statistics.median(others))


def pieces_across_ranks(reports: Mapping[int, RankRecord], rank: int) -> list[PieceAcrossRanks]:
    """Every non-nesting piece of `rank` (see `_regions`) with the same piece on every rank, costliest first."""
    regions = {r: _regions(report) for r, report in reports.items()}
    rows = []
    for piece in sorted(regions[rank].values(), key=lambda p: -p.ms_per_step):
        figures = {}
        for r in reports:
            other = regions[r].get(_key(piece))
            figures[r] = None if other is None else other.ms_per_step
        others = [ms for r, ms in figures.items() if r != rank and ms is not None]
        excess = piece.ms_per_step - statistics.median(others) if others else None
        rows.append(PieceAcrossRanks(piece.label, piece.executor, figures, excess))
    return rows


def slowest_pieces(reports: Mapping[int, RankRecord], rank: int, limit: int = 8) -> list[PieceAcrossRanks]:
    """The `limit` costliest pieces of `rank`, and the `limit // 2` others where it loses most against the other
    ranks (largest positive excess), each with the same piece on every rank; sorted by `rank`'s time per step."""
    rows = pieces_across_ranks(reports, rank)
    chosen, rest = rows[:limit], rows[limit:]
    losers = sorted((r for r in rest if r.excess_ms and r.excess_ms > 0), key=lambda r: -r.excess_ms)
    chosen += losers[: limit // 2]
    return sorted(chosen, key=lambda r: -(r.ms_per_step[rank] or 0.0))


def outside_graphs_note(reports: Mapping[int, RankRecord]) -> list[str]:
    """What the figures count of the run's collectives and what they do not, in sentences for the reader."""
    if any(collective_places(r) for r in reports.values()):
        notes = ["collectives inside compiled graphs are counted where their piece is timed (an inductor split "
                 "holding one counted whole)"]
    else:
        notes = ["no collective ran inside a compiled graph on any rank"]
    outside = "collectives outside the graphs (DDP's bucket all-reduces in its autograd hooks, FSDP2's all-gathers " \
              "and reduce-scatters in its module hooks)"
    if any(r.collectives is not None for r in reports.values()):
        notes.append(f"{outside} are in no figure of the graphs; the flight recorder's figures above show when each "
                     "rank enqueued them (and their device time where c10d timed them)")
    else:
        notes.append(f"{outside} and the time ranks wait in them are in no figure here (TORCH_FR_BUFFER_SIZE=N "
                     "(with NCCL also TORCH_NCCL_ENABLE_TIMING=1) records them in torch's flight recorder, which "
                     "the dump then reads)")
    notes.append("what collectives running beside a compiled piece cost it (contention for the device or the cores) "
                 "is inside that piece's time, not told apart")
    return notes


# ---- collectives outside the graphs: the flight recorders of the ranks --------------------------------------------


@dataclasses.dataclass(frozen=True)
class ArrivalLags:
    """When each rank enqueued the collectives that every rank's flight recorder holds (`matched` of them, matched
    by process group and sequence number, over `span_s` seconds of the first rank's clock): `last[r]` how many rank r
    enqueued last, `median_lag_ms[r]` and `total_lag_ms[r]` how much later than the earliest rank it enqueued them.
    A collective completes only once its last rank has enqueued it, so a rank that is late everywhere holds the
    others back: they wait about its lag. Times are the ranks' system clocks: comparable on one host
    (`same_host`), off by the hosts' clock offset across hosts."""

    matched: int
    span_s: float
    last: Mapping[int, int]
    median_lag_ms: Mapping[int, float]
    total_lag_ms: Mapping[int, float]
    same_host: bool

    @property
    def latest(self) -> int | None:
        """The rank that enqueued the most of them last (then the longest median lag); None where no rank lagged.
        Not the longest total lag: a few long waits (a rank compiling while the others wait at the first collective)
        outweigh a lag at every step."""
        late = max(self.last, key=lambda r: (self.last[r], self.median_lag_ms[r], r))
        return late if self.total_lag_ms[late] > 0 else None


def arrival_lags(reports: Mapping[int, RankRecord]) -> ArrivalLags | None:
    """The ranks' arrival at their common collectives (None with fewer than two ranks logging collectives).

    Example (rank 1 enqueues every collective 5 ms after rank 0):
        >>> from thunderfx_debug.records import CollectiveCall, CollectiveLog
        >>> def rank(r, late_ms):
        ...     calls = [CollectiveCall("gloo:all_reduce", "0", s, s * 10**8 + int(late_ms * 1e6)) for s in (1, 2, 3)]
        ...     log = CollectiveLog("_dump_fr_trace_json", 100, tuple(calls))
        ...     return RankRecord(meta={"rank": r, "collectives": log.to_json()})
        >>> lags = arrival_lags({0: rank(0, 0), 1: rank(1, 5)})
        >>> lags.matched, dict(lags.last), dict(lags.median_lag_ms)
        (3, {0: 0, 1: 3}, {0: 0.0, 1: 5.0})
    """
    logs = {r: report.collectives for r, report in reports.items() if report.collectives is not None}
    if len(logs) < 2:
        return None
    created = {r: {(c.group, c.seq): c.created_ns for c in log.calls} for r, log in logs.items()}
    common = set.intersection(*(set(keys) for keys in created.values()))
    if not common:
        return None
    lags: dict[int, list[float]] = {r: [] for r in logs}
    last = {r: 0 for r in logs}
    for key in common:
        times = {r: created[r][key] for r in logs}
        first = min(times.values())
        last[max(times, key=lambda r: (times[r], r))] += 1
        for r, t in times.items():
            lags[r].append((t - first) / 1e6)
    first_rank = next(iter(logs))
    stamps = [created[first_rank][key] for key in common]
    hosts = {reports[r].meta.get("hostname") for r in logs}
    return ArrivalLags(
        matched=len(common),
        span_s=(max(stamps) - min(stamps)) / 1e9,
        last=last,
        median_lag_ms={r: statistics.median(v) for r, v in lags.items()},
        total_lag_ms={r: sum(v) for r, v in lags.items()},
        same_host=len(hosts) == 1,
    )


@dataclasses.dataclass(frozen=True)
class CollectiveTimes:
    """Device time of one kind of collective on each rank, where c10d timed them (NCCL, TORCH_NCCL_ENABLE_TIMING=1):
    rank -> (count, median ms, total ms). A collective's time includes waiting for the other ranks: the ranks that
    are not late spend longest in them."""

    name: str
    by_rank: Mapping[int, tuple[int, float, float]]


def collective_times(reports: Mapping[int, RankRecord]) -> list[CollectiveTimes]:
    """Per kind of collective, the timed ones on each rank; kinds with the most time first."""
    by_name: dict[str, dict[int, list[float]]] = {}
    for r, report in reports.items():
        log = report.collectives
        for call in log.calls if log is not None else ():
            if call.duration_ms is not None:
                by_name.setdefault(call.name, {}).setdefault(r, []).append(call.duration_ms)
    rows = [CollectiveTimes(name, {r: (len(v), statistics.median(v), sum(v)) for r, v in ranks_.items()})
            for name, ranks_ in by_name.items()]
    return sorted(rows, key=lambda row: -max(total for _, _, total in row.by_rank.values()))
