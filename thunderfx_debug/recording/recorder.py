"""In-memory recording of what ThunderFX did with each Dynamo graph, read back as snapshots at report and flush time.

The training path only updates counters and, on sampled calls, timing marks (see `runners`). Everything costly
(reading Thunder's traces, turning them into text, resolving timing samples) happens in `snapshot()`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.settings.config import Config
from thunderfx_debug.records import FailedIn, InputMeta, Phase, SplitKind, SplitReason
from thunderfx_debug.recording.capture import Captured, agrees, with_recorded_ranges
from thunderfx_debug.recording.check import CheckTally
from thunderfx_debug.recording.compile_cost import BackendCall, FirstCall
from thunderfx_debug.recording.host import CallWaits, host_series
from thunderfx_debug.recording.memory import MemoryProbe, PieceMemory
from thunderfx_debug.recording.steps import StepCounter
from thunderfx_debug.recording.timing import Clock, RegionTimer, SampleSeries, clock_for
from thunderfx_debug.settings.safety import ReportingFailures, describe_exception
from thunderfx_debug.thunder import dynamo as thunder_dynamo
from thunderfx_debug.thunder import provenance as thunder_provenance
from thunderfx_debug.thunder.compile_events import SPANS
from thunderfx_debug.thunder import splits as thunder_splits
from thunderfx_debug.thunder import traces as thunder_traces
from thunderfx_debug.thunder.dynamo import GraphFacts
from thunderfx_debug.thunder.failures import ExceptionFacts, exception_facts
from thunderfx_debug.thunder.splits import CompiledSplit
from thunderfx_debug.thunder.traces import FusionRegion

if TYPE_CHECKING:
    from thunderfx_debug.recording.sampler import TimedCalls

log = logging.getLogger("thunderfx_debug")


@dataclasses.dataclass
class PieceFailure:
    """Where a piece raised in the run (`records.RunFailure` is its record): in its forward or backward, at its
    `call`-th call; `captured` the inputs of that call where it was not the first (whose inputs every piece keeps)."""

    failed_in: FailedIn
    call: int
    captured: Captured | None = None


@dataclasses.dataclass
class GraphFailure:
    """What the run raised in a graph: the piece that raised (a split's name; None for the graph itself, which
    failed to compile or raised outside its splits), where, and the exception as it was raised."""

    split: str | None
    where: PieceFailure
    facts: ExceptionFacts
    graph_captured: Captured | None = None  # the graph's inputs at the failing call, where it was not the first


@dataclasses.dataclass
class SplitState:
    split: CompiledSplit
    forward: SampleSeries
    backward: SampleSeries
    calls: int = 0
    error: str | None = None
    # Filled by the fusion-level timing of the split, keyed by region ("nvFusion0_forward") and "outside_forward".
    region_series: dict[str, SampleSeries] = dataclasses.field(default_factory=dict)
    # The timer that fills them (and `op_series`) from the marks of the split's traces, read at its `resolve`.
    region_timer: RegionTimer | None = dataclasses.field(default=None, repr=False)
    captured: Captured | None = None  # its first call (see `capture`)
    # Filled by the split's region observer (`capture.RegionCapture`), keyed by region ("nvFusion0_forward").
    region_captures: dict[str, Captured] = dataclasses.field(default_factory=dict)
    # What the last snapshot read of the split's traces: (forward trace, backward trace, regions, texts, sources).
    # Reused while Thunder's final traces stay the same objects, so a flush of a long run neither walks nor prints them.
    traces_read: tuple | None = dataclasses.field(default=None, repr=False)
    # ... and its time outside the regions by op group, keyed (phase, symbol, executor); how many ops each group has.
    op_series: dict[tuple[str, str, str], SampleSeries] = dataclasses.field(default_factory=dict)
    op_counts: dict[tuple[str, str, str], int] = dataclasses.field(default_factory=dict)
    first: FirstCall | None = None  # the host's view of the first call (compile cost)
    host_forward: SampleSeries | None = None  # host wall of sampled calls, where `forward` is device time
    host_backward: SampleSeries | None = None
    overhead: SampleSeries | None = None  # Thunder's own host time per sampled forward call (thunder splits)
    # The correctness sentinel's findings (THUNDERFX_DEBUG_CHECK): the split's, and its regions' by region key.
    check: CheckTally | None = None
    region_checks: dict[str, CheckTally] = dataclasses.field(default_factory=dict)
    memory: PieceMemory = dataclasses.field(default_factory=PieceMemory)  # its sampled calls (`recording.memory`)
    failure: PieceFailure | None = None  # where it raised in the run, the first time it did

    @property
    def name(self) -> str:
        return self.split.name


@dataclasses.dataclass
class GraphState:
    index: int
    gm: torch.fx.GraphModule  # the Dynamo graph as handed to the backend (kept for repro scripts)
    facts: GraphFacts
    input_meta: tuple[InputMeta, ...]
    clock: Clock
    forward: SampleSeries
    backward: SampleSeries
    splits: list[SplitState] = dataclasses.field(default_factory=list)
    unattributed_reasons: list[SplitReason] = dataclasses.field(default_factory=list)
    calls: int = 0
    error: str | None = None
    failed_split: str | None = None  # the split that raised, when the graph failed at a call
    failure: GraphFailure | None = None  # what the run first raised in the graph (`Recorder.graph_failed`)
    dynamic: bool = False  # Dynamo handed it symbolic shapes (ThunderFX compiles it for dynamic shapes)
    fallback: bool = False
    compile_time_s: float | None = None
    split_gm: torch.fx.GraphModule | None = None
    captured: Captured | None = None  # its first call (see `capture`)
    origin_ns: int = 0  # the start of the run's host clock (`Recorder.origin_ns`)
    backend_started_ns: int = 0
    dynamo_started_ns: int | None = None  # the Dynamo compile the backend call was part of
    backend: BackendCall | None = None
    first: FirstCall | None = None
    host_forward: SampleSeries | None = None
    host_backward: SampleSeries | None = None
    period: SampleSeries = dataclasses.field(default_factory=host_series)
    waits: CallWaits = dataclasses.field(default_factory=CallWaits)
    memory: PieceMemory = dataclasses.field(default_factory=PieceMemory)  # its sampled calls (`recording.memory`)
    timed_calls: TimedCalls | None = None  # which sampled calls are timed (THUNDERFX_DEBUG_TIMING_SHARE below 100)

    @property
    def name(self) -> str:
        return f"graph{self.index}"

    def to_resolve(self):
        """What holds the graph's unread timing marks, each with a `resolve(wait)`: every sample series of the graph,
        its splits and their regions, and each split's region timer before the series it fills, so that resolving
        them in this order reads its traces' marks into them first."""
        yield self.forward
        yield self.backward
        yield self.period
        yield from (s for s in (self.host_forward, self.host_backward) if s is not None)
        if self.first is not None:
            yield from (self.first.forward, self.first.backward)
        for split in self.splits:
            yield split.forward
            yield split.backward
            if split.region_timer is not None:
                yield split.region_timer
            yield from split.region_series.values()
            yield from split.op_series.values()
            yield from (s for s in (split.host_forward, split.host_backward, split.overhead) if s is not None)
            if split.first is not None:
                yield from (split.first.forward, split.first.backward)


@dataclasses.dataclass
class SplitSnapshot:
    """A split as read at snapshot time: its state plus the Thunder objects (traces, fusion regions) behind it.

    `input_meta` is what the split received on its first call where that was captured (with value statistics),
    else what Thunder's splitter recorded. `region_input_meta` and `region_captures` hold, by region key, the same
    for the fusion regions whose captured call agrees with the final trace (the others have only their trace's
    proxies: `FusionRegion.input_meta`). `sources` are where the ops of its regions and op groups came from,
    and where the saved values its backward ones read were made."""

    state: SplitState
    fwd_trace: Any = None
    bwd_trace: Any = None
    regions: list[FusionRegion] = dataclasses.field(default_factory=list)
    input_meta: tuple[InputMeta, ...] = ()
    region_input_meta: dict[str, tuple[InputMeta, ...]] = dataclasses.field(default_factory=dict)
    region_captures: dict[str, Captured] = dataclasses.field(default_factory=dict)
    sources: thunder_provenance.TraceSources = dataclasses.field(default_factory=thunder_provenance.TraceSources)

    def region_metas(self, region: FusionRegion) -> tuple[InputMeta, ...]:
        return self.region_input_meta.get(region.key, region.input_meta)

    @functools.cached_property
    def fwd_text(self) -> str | None:
        return None if self.fwd_trace is None else str(self.fwd_trace)

    @functools.cached_property
    def bwd_text(self) -> str | None:
        return None if self.bwd_trace is None else str(self.bwd_trace)


@dataclasses.dataclass
class GraphSnapshot:
    """A graph as read at snapshot time; `input_meta` as `SplitSnapshot.input_meta`."""

    state: GraphState
    splits: list[SplitSnapshot]
    input_meta: tuple[InputMeta, ...] = ()


class Recorder:
    """Holds the per-graph states of one process; `snapshot()` reads them, with what Thunder built, for a report."""

    def __init__(self, config: Config):
        self.config = config
        self.graphs: list[GraphState] = []
        self.failures = ReportingFailures(config.strict)
        self.frame_compiles: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.origin_ns = time.perf_counter_ns()  # the run's host clock: compile costs are placed on it
        self.memory = MemoryProbe(self.failures)  # the sampled calls' memory, every graph's (`recording.memory`)
        self.steps = StepCounter(self.failures)  # the optimizer's steps, from the first compile on
        SPANS.install()

    # ---- training path (compile time) -------------------------------------------------------------------------
    def new_graph(self, gm: torch.fx.GraphModule, example_inputs) -> GraphState:
        backend_started_ns = time.perf_counter_ns()
        self.steps.start()
        dynamo_started_ns = SPANS.open_start_ns  # the compile in progress (its start callback ran before this call)
        SPANS.install()  # again: torch._dynamo.reset() removes Dynamo's callbacks
        facts = GraphFacts()
        with self.failures.guard("reading Dynamo's compile id and break reason"):
            facts = thunder_dynamo.graph_facts(gm)
        metas: tuple[InputMeta, ...] = ()
        with self.failures.guard("reading the metadata of a graph's inputs"):
            metas = tuple(thunder_splits.input_meta(x) for x in example_inputs)
        clock = clock_for({str(x.device) for x in example_inputs if isinstance(x, torch.Tensor)})
        state = GraphState(
            index=len(self.graphs), gm=gm, facts=facts, input_meta=metas, clock=clock,
            forward=SampleSeries(clock), backward=SampleSeries(clock),
            origin_ns=self.origin_ns, backend_started_ns=backend_started_ns, dynamo_started_ns=dynamo_started_ns,
        )
        self.graphs.append(state)
        with self.failures.guard(f"counting the compiles of the frame of {state.name}"):
            self._warn_on_recompiles(state)
        return state

    def _warn_on_recompiles(self, state: GraphState) -> None:
        frame = state.facts.frame_id
        if not frame:
            return
        if any(g.facts.compile_id == state.facts.compile_id for g in self.graphs if g is not state):
            return  # another graph of the same compile (DDP's optimizer hands one graph per bucket)
        self.frame_compiles[frame] += 1
        threshold = self.config.recompile_warn_threshold
        if self.frame_compiles[frame] == threshold + 1:
            where = f" ({state.facts.frame})" if state.facts.frame else ""
            message = (
                f"Dynamo frame {frame}{where} was compiled {self.frame_compiles[frame]} times, more than "
                f"THUNDERFX_DEBUG_RECOMPILE_WARN={threshold} (last reason: "
                f"{state.facts.recompile_reason or 'not recorded'}); each compile runs ThunderFX again."
            )
            self.warnings.append(message)
            log.warning("thunderfx_debug: %s", message)

    def graph_compiled(self, state: GraphState, info, split_gm: torch.fx.GraphModule, compile_time_s: float) -> None:
        state.compile_time_s = compile_time_s
        state.split_gm = split_gm
        state.backend = BackendCall(state.backend_started_ns, time.perf_counter_ns(), state.dynamo_started_ns)
        with self.failures.guard(f"reading the splits of {state.name}"):
            splits, unattributed = thunder_splits.compiled_splits(info, split_gm)
            state.splits = [SplitState(s, SampleSeries(state.clock), SampleSeries(state.clock)) for s in splits]
            state.unattributed_reasons = unattributed

    def graph_failed(self, state: GraphState, error: BaseException, where: PieceFailure | None = None,
                     graph_captured: Captured | None = None) -> None:
        """Records what the run raised in `state`'s graph: in the split its runner noted (`failed_split`, where the
        split's own `failure` says when), else in the graph itself, `where` (None: while compiling it);
        `graph_captured` the graph's inputs at a failing call that is not its first. The first failure of a graph is
        the one its record names; `error` keeps the text of the latest."""
        state.error = describe_exception(error)
        if state.failure is not None:
            return
        with self.failures.guard(f"reading the exception {state.name} raised"):
            split = next((s for s in state.splits if s.name == state.failed_split), None)
            if split is not None and split.failure is not None:
                state.failure = GraphFailure(split.name, split.failure, exception_facts(error), graph_captured)
            else:
                state.failure = GraphFailure(None, where or PieceFailure(FailedIn.COMPILE, 0), exception_facts(error),
                                             graph_captured)

    # ---- off the training path ----------------------------------------------------------------------------------
    def snapshot(self, wait: bool) -> list[GraphSnapshot]:
        """Reads what Thunder built for each split (traces, fusion regions) and resolves timing samples.

        `wait=True` (at flush) waits for outstanding CUDA events; `wait=False` leaves incomplete ones for later.
        """
        return [self.graph_snapshot(state, wait) for state in self.graphs]

    def graph_snapshot(self, state: GraphState, wait: bool) -> GraphSnapshot:
        """One graph's snapshot (see `snapshot`)."""
        for marks in state.to_resolve():
            with self.failures.guard(f"reading timing samples of {state.name}"):
                marks.resolve(wait=wait)
        splits = [self._split_snapshot(state, split, wait) for split in state.splits]
        metas = self._observed(state.name, state.captured, state.input_meta, wait)
        return GraphSnapshot(state, splits, state.input_meta if metas is None else metas)

    def one_split(self, state: GraphState, split: SplitState) -> GraphSnapshot:
        """A snapshot of `state` holding `split` only, read without waiting for the device and without resolving
        timing samples (which the training thread appends to): what the triage reads to compile a split ahead of the
        flush, from a thread of its own (`triage.ahead`)."""
        snap = self._split_snapshot(state, split, wait=False)
        metas = self._observed(state.name, state.captured, state.input_meta, wait=False)
        return GraphSnapshot(state, [snap], state.input_meta if metas is None else metas)

    def _observed(self, where: str, captured: Captured | None, recorded: tuple[InputMeta, ...],
                  wait: bool) -> tuple[InputMeta, ...] | None:
        """The captured metadata of a piece's first call where it agrees with `recorded`, else None."""
        with self.failures.guard(f"reading the captured inputs of {where}"):
            metas = captured.metas(wait) if captured is not None else None
            if metas is not None and agrees(recorded, metas):
                return with_recorded_ranges(recorded, metas)
        return None

    def _with_region_captures(self, snap: SplitSnapshot, where: str, wait: bool) -> SplitSnapshot:
        """`snap` with the captured calls of its regions that agree with their final traces."""
        for region in snap.regions:
            captured = snap.state.region_captures.get(region.key)
            metas = None if captured is None else self._observed(f"{where}/{region.key}", captured,
                                                                 region.input_meta, wait)
            if metas is not None:
                snap.region_input_meta[region.key] = metas
                snap.region_captures[region.key] = captured
        return snap

    def _split_snapshot(self, state: GraphState, split: SplitState, wait: bool) -> SplitSnapshot:
        where = PieceKey.of(state.name, split.name)
        metas = self._observed(where, split.captured, split.split.input_meta, wait)
        snap = SplitSnapshot(split, input_meta=split.split.input_meta if metas is None else metas)
        if split.split.kind is not SplitKind.THUNDER:
            return snap
        failures_before = self.failures.total
        with self.failures.guard(f"reading the traces of {where}"):
            snap.fwd_trace, snap.bwd_trace = thunder_traces.final_traces(split.split.compiled)
        read = split.traces_read
        if read is not None and read[0] is snap.fwd_trace and read[1] is snap.bwd_trace:
            snap.regions, snap.sources = list(read[2]), read[5]
            snap.__dict__["fwd_text"], snap.__dict__["bwd_text"] = read[3], read[4]
            return self._with_region_captures(snap, where, wait)
        split.traces_read = None  # read again below; kept only if everything could be read
        with self.failures.guard(f"reading the fusion regions of {where}"):
            snap.regions = thunder_traces.fusion_regions(snap.fwd_trace, Phase.FORWARD)
            snap.regions += thunder_traces.fusion_regions(snap.bwd_trace, Phase.BACKWARD)
        with self.failures.guard(f"reading where the ops of {where} came from"):
            snap.sources = thunder_provenance.trace_sources(split.split.compiled, snap.regions, snap.fwd_trace,
                                                            snap.bwd_trace)
        for text in ("fwd_text", "bwd_text"):
            # Printed here, guarded, so that a trace that cannot be printed loses its text only, not the record of
            # its graph (which reads the text later).
            with self.failures.guard(f"printing the traces of {where}"):
                getattr(snap, text)
            snap.__dict__.setdefault(text, None)  # cached_property's slot: None after a failure
        if self.failures.total == failures_before and snap.fwd_trace is not None:
            split.traces_read = (snap.fwd_trace, snap.bwd_trace, tuple(snap.regions), snap.fwd_text, snap.bwd_text,
                                 snap.sources)
        return self._with_region_captures(snap, where, wait)
