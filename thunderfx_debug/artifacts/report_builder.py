"""The `Report` of the recorder's snapshots: records built from the states and the Thunder objects read at
snapshot time, with the dump files each record owns and what the flush's work in processes of its own found of each
piece (`FlushFindings`: the triage's verdicts, the minimizer's reductions), the one way they reach the records."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from thunderfx_debug.artifacts.source_excerpts import excerpts
from thunderfx_debug.records import (FailedIn, FusionRecord, GraphRecord, Minimized, OpGroup, RunFailure, SplitRecord,
                                     Triage)
from thunderfx_debug.recording import compile_cost
from thunderfx_debug.recording.check import CheckTally
from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot, SplitState
from thunderfx_debug.recording.timing import SampleSeries
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest
from thunderfx_debug.render.headline import left_out_calls, summed_headline
from thunderfx_debug.render.report import Report
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.compile_events import SPANS
from thunderfx_debug.thunder import provenance as thunder_provenance
from thunderfx_debug.thunder.provenance import TraceSources

#: owner key ("graph0", "graph0/thunder_0", "graph0/thunder_0/nvFusion0_forward") -> {label: path in the dump}
FileIndex = Mapping[str, Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class FlushFindings:
    """What the flush's work in processes of its own found, by owner key ("graph0/thunder_0",
    "graph0/thunder_0/nvFusion0_forward"): each piece's triage against inductor (`thunderfx_debug.triage.at_flush`) and
    the reduction of each piece the sentinel flagged (`thunderfx_debug.minimize.at_flush`)."""

    triage: Mapping[str, Triage] = dataclasses.field(default_factory=dict)
    minimized: Mapping[str, Minimized] = dataclasses.field(default_factory=dict)


def build_report(snapshots: list[GraphSnapshot], files: FileIndex, meta: Mapping[str, Any],
                 failures: ReportingFailures, findings: FlushFindings | None = None) -> Report:
    findings = findings or FlushFindings()
    graphs = []
    for snap in snapshots:
        with failures.guard(f"building the record of {snap.state.name}"):
            graphs.append(_graph_record(snap, files, findings))
    report = Report(graphs=tuple(graphs), meta=dict(meta))
    if findings.triage:
        with failures.guard("setting the triage beside the run's own figures"):
            report = triage_beside_the_run(report)
    return report


def triage_beside_the_run(report: Report) -> Report:
    """`report` with each triage record given the run's figures of its piece: how often it runs per training step
    (`digest.steps`) and its own time per call in the run, by the headline rule (`headline.summed_headline`: the
    first sampled call and the disturbed ones left out, as every figure of the run leaves them out), where the run
    sampled it on the triage's clock."""
    steps = digest.steps(report)

    def beside(triage: Triage | None, graph, timings) -> Triage | None:
        if triage is None:
            return None
        triage = dataclasses.replace(triage, calls_per_step=steps.per_step(graph))
        timed = [t for t in timings if t is not None and t.count]
        if triage.error is not None or not timed or timed[0].clock is not triage.clock:
            return triage
        run = summed_headline(timed, left_out_calls(graph))
        if run is None or not run.count:  # no sample but the first or disturbed ones: nothing to set beside it
            return triage
        return dataclasses.replace(triage, run_ms=run.median_ms, run_samples=run.count)

    graphs = []
    for graph in report.graphs:
        splits = []
        for split in graph.splits:
            fusions = tuple(dataclasses.replace(f, triage=beside(f.triage, graph, [f.timing]))
                            if f.triage is not None else f for f in split.fusions)
            splits.append(dataclasses.replace(split, fusions=fusions, triage=beside(
                split.triage, graph, [split.timing, split.backward_timing])))
        graphs.append(dataclasses.replace(graph, splits=tuple(splits)))
    return dataclasses.replace(report, graphs=tuple(graphs))


def _timing(series: SampleSeries | None):
    return None if series is None else series.timing()


def _op_groups(split: SplitState, sources: TraceSources) -> tuple[OpGroup, ...]:
    groups = []
    for key, series in split.op_series.items():
        phase, symbol, executor = key
        groups.append(OpGroup(symbol, executor, phase, split.op_counts.get(key, 0), series.timing(),
                              sources.op_groups.get(key, ()), sources.op_groups_reads_saved_from.get(key, ())))
    return tuple(sorted(groups, key=lambda g: (g.phase.value != "forward", -(g.timing.total_ms if g.timing else 0))))


def _check(tally: CheckTally | None):
    return None if tally is None else tally.record()


def _split_record(graph: str, snap: SplitSnapshot, files: FileIndex, origin_ns: int,
                  findings: FlushFindings) -> SplitRecord:
    split = snap.state
    key = PieceKey.of(graph, split.name)
    fusions = tuple(
        FusionRecord(
            name=r.name,
            executor=r.executor,
            phase=r.phase,
            ops=r.ops,
            inputs=r.inputs,
            outputs=r.outputs,
            input_meta=snap.region_metas(r),
            timing=_timing(split.region_series.get(r.key)),
            files=files.get(key.region(r.key), {}),
            check=_check(split.region_checks.get(r.key)),
            triage=findings.triage.get(key.region(r.key)),
            minimized=findings.minimized.get(key.region(r.key)),
            sources=snap.sources.regions.get(r.key, ()),
            reads_saved_from=snap.sources.regions_reads_saved_from.get(r.key, ()),
        )
        for r in snap.regions
    )
    outside = {name: series.timing() for name, series in split.region_series.items() if name.startswith("outside_")}
    return SplitRecord(
        name=split.name,
        kind=split.split.kind,
        ops=split.split.ops,
        reasons=tuple(split.split.reasons),
        fusions=fusions,
        fwd_trace=snap.fwd_text,
        bwd_trace=snap.bwd_text,
        input_meta=snap.input_meta,
        timing=split.forward.timing(),
        backward_timing=split.backward.timing(),
        outside_fusions_timing={name: timing for name, timing in outside.items() if timing is not None},
        error=split.error,
        files=files.get(key, {}),
        host_timing=_timing(split.host_forward),
        host_backward_timing=_timing(split.host_backward),
        thunder_overhead_timing=_timing(split.overhead),
        op_groups=_op_groups(split, snap.sources),
        compile_cost=compile_cost.split_cost(split.first, split.split.kind, origin_ns, SPANS),
        check=_check(split.check),
        triage=findings.triage.get(key),
        minimized=findings.minimized.get(key),
        sources=split.split.sources,
        memory=split.memory.record(),
    )


def _sources_of(splits: tuple[SplitRecord, ...]) -> list[str]:
    """Every source line the splits, their regions and op groups name (their own and their saved values')."""
    pieces = [*(f for s in splits for f in s.fusions), *(g for s in splits for g in s.op_groups)]
    return [*(source for s in splits for source in s.sources),
            *(source for piece in pieces for source in (*piece.sources, *piece.reads_saved_from))]


def _run_failure(snap: GraphSnapshot, files: FileIndex) -> RunFailure | None:
    """The record of what the run raised in the graph, with the script that reproduces it where one was written (the
    Thunder script of the failing split, or of the graph where no split raised)."""
    state, failure = snap.state, snap.state.failure
    if failure is None:
        return None
    facts, where = failure.facts, failure.where
    split = next((s for s in snap.splits if s.state.name == failure.split), None)
    piece = PieceKey.of(state.name, None if split is None else split.state.name)
    region = facts.region if split is not None and any(r.key == facts.region for r in split.regions) else None
    if split is None:
        sources = thunder_provenance.module_sources(state.gm)
    else:
        sources = (split.sources.regions.get(region, ()) if region else ()) or split.state.split.sources
    if where.failed_in is FailedIn.COMPILE:
        inputs_call = 0
    elif where.captured is not None or where.failed_in is FailedIn.FORWARD and where.call == 1:
        inputs_call = where.call
    else:  # a backward: the inputs are those of the first call (`builder.split_scripts`)
        inputs_call = 1
    return RunFailure(
        piece=piece, failed_in=where.failed_in, type=facts.type, message=facts.message, call=where.call,
        region=region, raised_at=facts.raised_at, raised_code=facts.raised_code, sources=tuple(sources),
        inputs_call=inputs_call, script=files.get(piece, {}).get("repro_thunder"),
        not_run=tuple(PieceKey.of(state.name, s.state.name) for s in snap.splits if s.state.calls == 0))


def _graph_record(snap: GraphSnapshot, files: FileIndex, findings: FlushFindings) -> GraphRecord:
    state, facts = snap.state, snap.state.facts
    origin_ns = state.origin_ns
    splits = tuple(_split_record(state.name, split, files, origin_ns, findings) for split in snap.splits)
    return GraphRecord(
        name=state.name,
        index=state.index,
        compile_id=facts.compile_id,
        break_reason=facts.break_reason,
        break_user_stack=facts.break_user_stack,
        recompile_reason=facts.recompile_reason,
        node_count=sum(1 for n in state.gm.graph.nodes if n.op not in ("placeholder", "output")),
        input_meta=snap.input_meta,
        splits=splits,
        unattributed_reasons=tuple(state.unattributed_reasons),
        calls=state.calls,
        timing=state.forward.timing(),
        backward_timing=state.backward.timing(),
        error=state.error,
        fallback=state.fallback,
        compile_time_s=state.compile_time_s,
        files=files.get(state.name, {}),
        compile_cost=compile_cost.graph_cost(state.first, state.backend, origin_ns, SPANS),
        host_timing=_timing(state.host_forward),
        host_backward_timing=_timing(state.host_backward),
        period_timing=state.period.timing(),
        disturbed=state.waits.disturbed(),
        source_excerpts=excerpts(_sources_of(splits)),
        memory=state.memory.record(),
        timing_passed_over=state.timed_calls.passed_over if state.timed_calls is not None else 0,
        failure=_run_failure(snap, files),
    )
