"""The backend's records as TORCH_TRACE artifacts, so that tlparse shows Thunder's side of each compile beside
Dynamo's: in the graph's compile-id folder of tlparse's output (`-_0_0_0/` for compile id 0/0), files named

    thunderfx_debug_graph0_splits_N.json               the splits, their ops, sources and split reasons (at compile)
    thunderfx_debug_graph0_thunder_0_fwd_trace_N.txt   the final Thunder traces of each thunder split (after the
    thunderfx_debug_graph0_thunder_0_bwd_trace_N.txt   graph's first call, when Thunder has built them)
    thunderfx_debug_graph0_thunder_0_fusions_N.json    its fusion regions: executor, phase, ops, inputs, outputs,
                                                       sources, lines that made the saved values a backward one reads
    thunderfx_debug_graph0_timing_N.json               timing statistics of the graph, its splits and regions (flush)
    thunderfx_debug_graph0_check_N.json                the correctness checks, where any piece was checked (flush)

(N is the entry's number in the log). Only while torch's trace log is on (`torch_trace.tracing_enabled`): otherwise
the backend makes no `TorchTraceEmitter` and nothing here runs. An artifact is written again only when its content
changed (the timing of a later flush, a retraced split), so periodic flushes add no copies.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from thunderfx_debug.artifacts.report_builder import build_report
from thunderfx_debug.records import FusionRecord, GraphRecord, SplitKind, SplitRecord, Timing
from thunderfx_debug.recording.recorder import GraphState, Recorder
from thunderfx_debug.thunder import torch_trace

TraceArtifact = tuple[str, Any]  # (artifact name, payload: text or JSON-able)


def _stats(timing: Timing | None) -> dict[str, Any] | None:
    if timing is None or not timing.count:
        return None
    return {"clock": timing.clock.value, **timing.stats()}


def _extra(record: SplitRecord | FusionRecord, key: str) -> Any:
    """A field of the record's JSON form that only some versions of the records have (`check`, `triage`)."""
    return record.to_json().get(key)


def structure_artifacts(graph: GraphRecord) -> list[TraceArtifact]:
    """How ThunderFX split the graph and why: known at compile."""
    payload = {
        "graph": graph.name,
        "compile_id": graph.compile_id,
        "break_reason": graph.break_reason,
        "node_count": graph.node_count,
        "splits": [{"name": s.name, "kind": s.kind.value, "ops": list(s.ops),
                    "reasons": [r.to_json() for r in s.reasons], "sources": list(s.sources)} for s in graph.splits],
        "unattributed_reasons": [r.to_json() for r in graph.unattributed_reasons],
        "error": graph.error,
        "fallback": graph.fallback,
    }
    return [(torch_trace.artifact_name(graph.name, "splits"), payload)]


def trace_artifacts(graph: GraphRecord) -> list[TraceArtifact]:
    """The final traces and fusion regions of each thunder split that has run."""
    artifacts: list[TraceArtifact] = []
    for split in graph.splits:
        if split.kind is not SplitKind.THUNDER:
            continue
        for label, text in (("fwd_trace", split.fwd_trace), ("bwd_trace", split.bwd_trace)):
            if text is not None:
                artifacts.append((torch_trace.artifact_name(graph.name, split.name, label), text))
        if split.fwd_trace is not None:
            fusions = [{"name": f.name, "executor": f.executor, "phase": f.phase.value, "ops": list(f.ops),
                        "inputs": list(f.inputs), "outputs": list(f.outputs),
                        "input_meta": [m.describe() for m in f.input_meta], "sources": list(f.sources),
                        "reads_saved_from": list(f.reads_saved_from)}
                       for f in split.fusions]
            artifacts.append((torch_trace.artifact_name(graph.name, split.name, "fusions"), fusions))
    return artifacts


def summary_artifacts(graph: GraphRecord) -> list[TraceArtifact]:
    """Timing statistics of the graph, its splits and fusion regions; the checks where any piece has one."""
    splits = []
    for split in graph.splits:
        entry = {"name": split.name, "kind": split.kind.value, "forward": _stats(split.timing),
                 "backward": _stats(split.backward_timing),
                 "outside_fusions": {k: _stats(t) for k, t in split.outside_fusions_timing.items()},
                 "fusions": [{"name": f.name, "phase": f.phase.value, "timing": _stats(f.timing)} for f in split.fusions]}
        triage = _extra(split, "triage")
        if triage is not None:
            entry["triage"] = triage
        splits.append(entry)
    timing = {"graph": graph.name, "compile_id": graph.compile_id, "calls": graph.calls,
              "forward": _stats(graph.timing), "backward": _stats(graph.backward_timing), "splits": splits}
    artifacts: list[TraceArtifact] = [(torch_trace.artifact_name(graph.name, "timing"), timing)]
    checks = []
    for split in graph.splits:
        fusions = [{"name": f.name, "phase": f.phase.value, "check": c} for f in split.fusions
                   if (c := _extra(f, "check")) is not None]
        check = _extra(split, "check")
        if check is not None or fusions:
            checks.append({"name": split.name, "check": check, "fusions": fusions})
    if checks:
        artifacts.append((torch_trace.artifact_name(graph.name, "check"),
                          {"graph": graph.name, "compile_id": graph.compile_id, "splits": checks}))
    return artifacts


class TorchTraceEmitter:
    """Writes the records of each graph into torch's trace log under the graph's compile: its structure at compile,
    its traces and fusions after its first call, everything that changed at each flush. Failures are reporting
    failures (logged once, never breaking training)."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.failures = recorder.failures
        self._trace_ids: dict[str, Any] = {}  # graph name -> torch TraceId of its compile
        self._written: dict[str, str] = {}  # artifact name -> digest of what was last written under it

    def graph_started(self, state: GraphState) -> None:
        """Call from the backend's call for the graph, while Dynamo's compile of it is in progress."""
        with self.failures.guard(f"reading the compile id of {state.name} for TORCH_TRACE"):
            trace_id = torch_trace.current_trace_id()
            if trace_id is not None:
                self._trace_ids[state.name] = trace_id

    def graph_compiled(self, state: GraphState) -> None:
        """At the end of the backend's call for the graph: its splits and split reasons."""
        with self.failures.guard(f"writing the TORCH_TRACE artifacts of {state.name}"):
            self._emit(self._record(state), structure_artifacts)

    def graph_ran(self, state: GraphState) -> None:
        """After the graph's first call: Thunder has built its traces."""
        with self.failures.guard(f"writing the TORCH_TRACE artifacts of {state.name}"):
            self._emit(self._record(state), structure_artifacts, trace_artifacts)

    def flushed(self, graphs: tuple[GraphRecord, ...]) -> None:
        """At flush: whatever changed since it was last written, timing and checks included."""
        for graph in graphs:
            with self.failures.guard(f"writing the TORCH_TRACE artifacts of {graph.name}"):
                self._emit(graph, structure_artifacts, trace_artifacts, summary_artifacts)

    def _record(self, state: GraphState) -> GraphRecord | None:
        report = build_report([self.recorder.graph_snapshot(state, wait=False)], {}, {}, self.failures)
        return report.graphs[0] if report.graphs else None

    def _emit(self, graph: GraphRecord | None, *makers) -> None:
        if graph is None:
            return
        trace_id = self._trace_ids.get(graph.name) or torch_trace.trace_id_of(graph.compile_id)
        for make in makers:
            for name, payload in make(graph):
                text = payload if isinstance(payload, str) else json.dumps(payload, indent=1, default=str)
                digest = hashlib.sha1(text.encode()).hexdigest()
                if self._written.get(name) == digest:
                    continue
                encoding = "string" if isinstance(payload, str) else "json"
                if torch_trace.emit(name, text, trace_id, encoding):
                    self._written[name] = digest
