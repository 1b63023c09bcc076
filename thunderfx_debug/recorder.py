"""In-memory recording of what ThunderFX did with each Dynamo graph, and the building of the Report from it.

The training path only updates counters and, on sampled calls, timing marks (see `runner`). Everything costly
(reading Thunder's traces, turning them into text, resolving timing samples) happens in `snapshot()`, which
`ReportingBackend.report()` and `flush()` call.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
from collections import Counter
from typing import Any

import torch

from thunderfx_debug import thunder_adapter
from thunderfx_debug.config import Config
from thunderfx_debug.records import (
    FusionRecord,
    GraphRecord,
    InputMeta,
    Phase,
    Report,
    SplitKind,
    SplitReason,
    SplitRecord,
)
from thunderfx_debug.safety import ReportingFailures
from thunderfx_debug.timing import Clock, SampleSeries


def describe_exception(error: BaseException) -> str:
    """Exception text with the innermost frames, short enough for a JSON field."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text if len(text) < 12000 else text[:2000] + "\n...\n" + text[-10000:]


@dataclasses.dataclass
class SplitState:
    piece: thunder_adapter.SplitPiece
    forward: SampleSeries
    backward: SampleSeries
    calls: int = 0
    error: str | None = None
    # Filled by the fusion-level timing transform, keyed by "nvFusion0_forward" and "outside_forward".
    region_series: dict[str, SampleSeries] = dataclasses.field(default_factory=dict)
    real_inputs: Any = None  # captured inputs (see repro.inputs), when THUNDERFX_DEBUG_INPUTS=real

    @property
    def name(self) -> str:
        return self.piece.name


@dataclasses.dataclass
class GraphState:
    index: int
    gm: torch.fx.GraphModule  # the Dynamo graph as handed to the backend (kept for repro scripts)
    facts: dict[str, Any]
    input_meta: tuple[InputMeta, ...]
    clock: Clock
    forward: SampleSeries
    backward: SampleSeries
    splits: list[SplitState] = dataclasses.field(default_factory=list)
    unattributed_reasons: list[SplitReason] = dataclasses.field(default_factory=list)
    calls: int = 0
    error: str | None = None
    failed_piece: str | None = None
    fallback: bool = False
    compile_time_s: float | None = None
    split_gm: Any = None
    real_inputs: Any = None
    failures: ReportingFailures | None = None  # the recorder's, for the runners' guards on the training path

    @property
    def name(self) -> str:
        return f"graph{self.index}"


@dataclasses.dataclass
class SplitSnapshot:
    """A split as read at snapshot time: its state plus the Thunder objects (traces, fusion regions) behind it."""

    state: SplitState
    fwd_trace: Any = None
    bwd_trace: Any = None
    regions: list[thunder_adapter.FusionRegion] = dataclasses.field(default_factory=list)

    @functools.cached_property
    def fwd_text(self) -> str | None:
        return None if self.fwd_trace is None else thunder_adapter.trace_source(self.fwd_trace)

    @functools.cached_property
    def bwd_text(self) -> str | None:
        return None if self.bwd_trace is None else thunder_adapter.trace_source(self.bwd_trace)


@dataclasses.dataclass
class GraphSnapshot:
    state: GraphState
    splits: list[SplitSnapshot]


class Recorder:
    """Holds the per-graph states of one process and turns them into a Report."""

    def __init__(self, config: Config, thunder_options: dict[str, Any]):
        self.config = config
        self.thunder_options = thunder_options
        self.graphs: list[GraphState] = []
        self.failures = ReportingFailures(config.strict)
        self.frame_compiles: Counter[str] = Counter()
        self.warnings: list[str] = []

    # ---- training path (compile time) -------------------------------------------------------------------------
    def new_graph(self, gm: torch.fx.GraphModule, example_inputs, clock: Clock) -> GraphState:
        facts: dict[str, Any] = {}
        with self.failures.guard("reading Dynamo's compile id and break reason"):
            facts = thunder_adapter.dynamo_graph_facts(gm)
        metas: tuple[InputMeta, ...] = ()
        with self.failures.guard("reading the metadata of a graph's inputs"):
            metas = tuple(thunder_adapter.input_meta(x) for x in example_inputs)
        state = GraphState(
            index=len(self.graphs),
            gm=gm,
            facts=facts,
            input_meta=metas,
            clock=clock,
            forward=SampleSeries(clock),
            backward=SampleSeries(clock),
            failures=self.failures,
        )
        self.graphs.append(state)
        return state

    def graph_compiled(self, state: GraphState, info, split_gm, compile_time_s: float) -> None:
        state.compile_time_s = compile_time_s
        state.split_gm = split_gm
        with self.failures.guard(f"reading the splits of {state.name}"):
            pieces, unattributed = thunder_adapter.split_pieces(info, split_gm)
            state.splits = [SplitState(p, SampleSeries(state.clock), SampleSeries(state.clock)) for p in pieces]
            state.unattributed_reasons = unattributed

    def graph_failed(self, state: GraphState, error: BaseException, piece: str | None) -> None:
        state.error = describe_exception(error)
        state.failed_piece = piece

    # ---- off the training path ----------------------------------------------------------------------------------
    def snapshot(self, wait: bool) -> list[GraphSnapshot]:
        """Reads what Thunder built for each split (traces, fusion regions) and resolves timing samples.

        `wait=True` (at flush) waits for outstanding CUDA events; `report()` without a dump does not.
        """
        snapshots = []
        for state in self.graphs:
            for series in self._series(state):
                with self.failures.guard(f"reading timing samples of {state.name}"):
                    series.resolve(wait=wait)
            splits = []
            for split in state.splits:
                snap = SplitSnapshot(split)
                if split.piece.kind is SplitKind.THUNDER:
                    with self.failures.guard(f"reading the traces of {state.name}/{split.name}"):
                        snap.fwd_trace, snap.bwd_trace = thunder_adapter.thunder_traces(split.piece.compiled)
                    with self.failures.guard(f"reading the fusion regions of {state.name}/{split.name}"):
                        snap.regions = thunder_adapter.fusion_regions(snap.fwd_trace, Phase.FORWARD)
                        snap.regions += thunder_adapter.fusion_regions(snap.bwd_trace, Phase.BACKWARD)
                    for text in ("fwd_text", "bwd_text"):
                        # Printed here, guarded, so that a trace that cannot be printed loses its text only,
                        # not the record of its graph (which reads the text later).
                        with self.failures.guard(f"printing the traces of {state.name}/{split.name}"):
                            getattr(snap, text)
                        snap.__dict__.setdefault(text, None)  # cached_property's slot: None after a failure
                splits.append(snap)
            snapshots.append(GraphSnapshot(state, splits))
        return snapshots

    @staticmethod
    def _series(state: GraphState):
        yield state.forward
        yield state.backward
        for split in state.splits:
            yield split.forward
            yield split.backward
            yield from split.region_series.values()

    def build_report(self, snapshots: list[GraphSnapshot], files: dict[str, dict[str, str]], meta: dict) -> Report:
        """The Report of the snapshots. `files` maps an owner key ("graph0", "graph0/thunder_0",
        "graph0/thunder_0/nvFusion0_forward") to {label: path in the dump}."""
        graphs = []
        for snap in snapshots:
            with self.failures.guard(f"building the record of {snap.state.name}"):
                graphs.append(self._graph_record(snap, files))
        return Report(graphs=tuple(graphs), meta=meta)

    def _graph_record(self, snap: GraphSnapshot, files: dict[str, dict[str, str]]) -> GraphRecord:
        state = snap.state
        splits = []
        for split_snap in snap.splits:
            split = split_snap.state
            key = f"{state.name}/{split.name}"
            fusions = tuple(
                FusionRecord(
                    name=r.name,
                    executor=r.executor,
                    phase=r.phase,
                    ops=r.ops,
                    inputs=r.inputs,
                    outputs=r.outputs,
                    input_meta=r.input_meta,
                    timing=_timing(split.region_series.get(f"{r.name}_{r.phase.value}")),
                    files=files.get(f"{key}/{r.name}_{r.phase.value}", {}),
                )
                for r in split_snap.regions
            )
            outside_timings = {
                key: series.timing() for key, series in split.region_series.items() if key.startswith("outside_")
            }
            outside = {key: timing for key, timing in outside_timings.items() if timing is not None}
            splits.append(
                SplitRecord(
                    name=split.name,
                    kind=split.piece.kind,
                    ops=split.piece.ops,
                    reasons=tuple(split.piece.reasons),
                    fusions=fusions,
                    fwd_trace=split_snap.fwd_text,
                    bwd_trace=split_snap.bwd_text,
                    input_meta=split.piece.input_meta,
                    timing=split.forward.timing(),
                    backward_timing=split.backward.timing(),
                    outside_fusions_timing=outside,
                    error=split.error,
                    files=files.get(key, {}),
                )
            )
        return GraphRecord(
            name=state.name,
            index=state.index,
            compile_id=state.facts.get("compile_id"),
            break_reason=state.facts.get("break_reason"),
            break_user_stack=tuple(state.facts.get("break_user_stack", ())),
            recompile_reason=state.facts.get("recompile_reason"),
            node_count=sum(1 for n in state.gm.graph.nodes if n.op not in ("placeholder", "output")),
            input_meta=state.input_meta,
            splits=tuple(splits),
            unattributed_reasons=tuple(state.unattributed_reasons),
            calls=state.calls,
            timing=state.forward.timing(),
            backward_timing=state.backward.timing(),
            error=state.error,
            fallback=state.fallback,
            compile_time_s=state.compile_time_s,
            files=files.get(state.name, {}),
        )


def _timing(series: SampleSeries | None):
    return None if series is None else series.timing()


