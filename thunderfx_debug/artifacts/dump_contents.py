"""Records in, files out: the `Report` of a flush and every file of its dump, as (relative path, content) pairs in
the order they are to be written (manifest.json, the index `load_report` reads first, last).

A flush has two halves. `ArtifactCache.artifacts` makes the traces and repro scripts of each graph from the
recorder's snapshots (it reads Thunder's objects, so it runs in the training process's own thread), once per graph
and again only when what they are made from changed. `report_files` turns the finished records into graph.json,
summary.txt, trace.json and manifest.json: records in, text out, nothing else touched, so it may run in another
thread. Between the two, `artifacts.report_builder.build_report` makes the records (`flusher` calls the three).
"""

from __future__ import annotations

import dataclasses

import json
from collections.abc import Mapping
from typing import Any

from thunderfx_debug.records import layout
from thunderfx_debug.artifacts.artifact import Artifact, ArtifactSettings
from thunderfx_debug.artifacts.repro.builder import pieces_with_scripts, scripts_for_graph
from thunderfx_debug.artifacts.report_builder import FileIndex
from thunderfx_debug.render.progress import announce, progress
from thunderfx_debug.render.text import plural
from thunderfx_debug.records import SCHEMA_VERSION, Phase, RankRecord
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot
from thunderfx_debug.render.chrome_trace import chrome_trace
from thunderfx_debug.render.triage_findings import render_triage_md
from thunderfx_debug.render.report import Report
from thunderfx_debug.settings.safety import ReportingFailures

DumpFiles = list[tuple[str, str | bytes]]


def file_index(artifacts: list[Artifact]) -> FileIndex:
    """owner ("graph0/thunder_0") -> {label: path}: what each record lists in its `files`."""
    index: dict[str, dict[str, str]] = {}
    for artifact in artifacts:
        index.setdefault(artifact.owner, {})[artifact.label] = artifact.path
    return index


def report_files(report: Report, artifacts: list[Artifact], failures: ReportingFailures) -> DumpFiles:
    """Every file of the dump, manifest.json last, from the finished records and artifacts (no Thunder, no torch)."""
    files: DumpFiles = [(a.path, a.content) for a in artifacts]
    files += [(f"{layout.graph_dir(g.name)}/{layout.GRAPH_JSON}", _json(g.to_json())) for g in report.graphs]
    files.append((layout.SUMMARY, str(report)))
    if any(s.triage is not None for g in report.graphs for s in g.splits):
        with failures.guard("rendering triage.md"):
            files.append((layout.TRIAGE, render_triage_md(report)))
    with failures.guard("rendering trace.json"):
        files.append((layout.CHROME_TRACE, _event_lines(chrome_trace(report))))
    files.append((layout.MANIFEST, _json(manifest_json(report))))
    return files


class ArtifactCache:
    """The traces and scripts of each graph of one run, made at the first flush that sees the graph and made again
    only when what they are made from changed: the objects of its splits' final traces (a new cache entry of
    Thunder's), a failure recorded on it, the inputs captured of it. The later flushes of a long run then make none.
    """

    def __init__(self):
        # graph index -> (what the artifacts were made from, the artifacts). The first element holds the objects
        # themselves, so that they stay alive and their ids stay theirs.
        self._graphs: dict[int, tuple[tuple, tuple, list[Artifact]]] = {}
        self._settings: ArtifactSettings | None = None

    def artifacts(self, snapshots: list[GraphSnapshot], settings: ArtifactSettings, failures: ReportingFailures,
                  show_progress: bool = False, deviating: Mapping[str, str] | None = None) -> list[Artifact]:
        """The artifacts of every graph of `snapshots`, in their order; `show_progress`: progress of the scripts
        (`progress`: a bar on a terminal, log lines otherwise) where making them takes more than a second;
        `deviating` (owner -> why) the pieces the triage found deviating, which get scripts too."""
        if settings != self._settings:  # other scripts asked for: none of the cached ones is right
            self._graphs, self._settings = {}, settings
        deviating = deviating or {}
        keys = {snapshot.state.index: _sources(snapshot, _of_graph(deviating, snapshot.state.name))
                for snapshot in snapshots}
        stale = [s for s in snapshots if (cached := self._graphs.get(s.state.index)) is None
                 or cached[1] != keys[s.state.index][1]]
        pieces = 0
        with failures.guard("counting the pieces that get repro scripts"):
            pieces = sum(len(pieces_with_scripts(s, settings, deviating)) for s in stale
                         if settings.repro or s.state.error or _of_graph(deviating, s.state.name))
        if pieces and show_progress:
            announce(f"thunderfx_debug: the flush writes the repro scripts of {plural(pieces, 'piece')}"
                     + (f" (THUNDERFX_DEBUG_REPRO={','.join(sorted(k.value for k in settings.repro))})"
                        if settings.repro else
                        " (pieces that failed or deviate get theirs whatever THUNDERFX_DEBUG_REPRO says)"))
        with progress(pieces, "writing repro scripts", unit="piece", enabled=show_progress) as step:
            for snapshot in stale:
                sources, key = keys[snapshot.state.index]
                self._graphs[snapshot.state.index] = (sources, key, _graph_artifacts(
                    snapshot, settings, failures, step, _of_graph(deviating, snapshot.state.name)))
        return [artifact for snapshot in snapshots for artifact in self._graphs[snapshot.state.index][2]]


def _of_graph(deviating: Mapping[str, str], graph: str) -> dict[str, str]:
    return {owner: why for owner, why in deviating.items() if owner.startswith(f"{graph}/")}


def _sources(snapshot: GraphSnapshot, deviating: Mapping[str, str]) -> tuple[tuple, tuple]:
    """The objects a graph's artifacts are made from, and the key (ids and texts) that changes when one does."""
    state = snapshot.state
    objects = [state.captured]
    key: list[Any] = [state.error, state.failed_split, state.fallback, _captured_key(state.captured),
                      tuple(sorted(deviating.items()))]
    for split in snapshot.splits:
        objects += [split.fwd_trace, split.bwd_trace, split.state.captured, *split.region_captures.values()]
        key.append((split.state.name, split.state.error, id(split.fwd_trace), id(split.bwd_trace),
                    split.fwd_text is None, split.bwd_text is None, len(split.regions),
                    _captured_key(split.state.captured),
                    tuple((region, _captured_key(c)) for region, c in sorted(split.region_captures.items()))))
        evidence = _evidence(split)  # a mismatch found since the last flush gets its script
        objects += evidence
        key.append(tuple(id(e) for e in evidence))
    return tuple(objects), tuple(key)


def _evidence(split: SplitSnapshot) -> list:
    """The evidence of the split's and its regions' first mismatches (`recording.check.Evidence`), where found."""
    tallies = [split.state.check, *split.state.region_checks.values()]
    return [t.evidence for t in tallies if t is not None and t.evidence is not None]


def _captured_key(captured) -> tuple | None:
    """What of a captured call the scripts depend on: the object, whether its values and statistics are in."""
    if captured is None:
        return None
    return (id(captured), captured.inputs is not None, captured.outputs is not None, captured.resolved)


def _graph_artifacts(snapshot: GraphSnapshot, settings: ArtifactSettings, failures: ReportingFailures,
                     on_piece, deviating: Mapping[str, str]) -> list[Artifact]:
    artifacts: list[Artifact] = []
    with failures.guard(f"collecting the traces of {snapshot.state.name}"):
        artifacts += trace_artifacts(snapshot)
    mismatches = any(_evidence(split) for split in snapshot.splits)
    if settings.repro or snapshot.state.error or mismatches or deviating:
        if (settings.real_inputs or mismatches) and not _host_copies_complete(snapshot.state.name, failures):
            settings = dataclasses.replace(settings, real_inputs=False)
        with failures.guard(f"writing the repro scripts of {snapshot.state.name}"):
            artifacts += scripts_for_graph(snapshot, settings, failures, on_piece=on_piece, deviating=deviating)
    return artifacts


def _host_copies_complete(graph: str, failures: ReportingFailures) -> bool:
    """The captured inputs are copied to the host without waiting (`recording.capture`); before they are saved,
    the copies must be complete. Once per graph whose scripts are made, not per flush. Where the device cannot be
    waited for (a device-side assert or an illegal memory access of the training left its context unusable), the
    copies cannot be trusted: the graph's scripts are written all the same, their inputs made from the metadata."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return True
    with failures.guard(f"waiting for the device before saving the inputs of {graph} (its scripts make their inputs "
                        "from the recorded metadata instead)"):
        torch.cuda.synchronize()
        return True
    return False


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=False, default=str) + "\n"


def _event_lines(trace: Mapping[str, Any]) -> str:
    """A Chrome trace as JSON with one event per line. Each event goes through json's C encoder, which an indented
    dump does not use: a long run's trace is encoded three times faster, a third the size, and in many short steps
    that leave the training thread its share of the GIL when a writer thread encodes it."""
    encode = json.JSONEncoder(default=str).encode  # one encoder for all events (json.dumps makes one per call)
    events = ",\n".join(map(encode, trace["traceEvents"]))
    rest = "".join(f",\n{encode(key)}: {encode(value)}" for key, value in trace.items() if key != "traceEvents")
    return '{"traceEvents": [\n' + events + "\n]" + rest + "}\n"


def manifest_json(report: RankRecord) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "thunderfx_debug",
        **dict(report.meta),
        "graphs": [
            {"name": g.name, "path": f"{layout.graph_dir(g.name)}/{layout.GRAPH_JSON}", "compile_id": g.compile_id}
            for g in report.graphs
        ],
    }


def trace_artifacts(snapshot: GraphSnapshot) -> list[Artifact]:
    graph = snapshot.state.name
    artifacts = []
    for split in snapshot.splits:
        for phase, text in ((Phase.FORWARD, split.fwd_text), (Phase.BACKWARD, split.bwd_text)):
            if text is not None:
                label = "fwd_trace" if phase is Phase.FORWARD else "bwd_trace"
                path = layout.trace_file(graph, split.state.name, phase.value)
                artifacts.append(Artifact(PieceKey.of(graph, split.state.name), label, path, text))
    return artifacts
