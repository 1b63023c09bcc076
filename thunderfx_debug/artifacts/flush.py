"""Records in, files out: the `Report` of a flush and every file of its dump, as (relative path, content) pairs in
the order they are to be written (manifest.json, the index `load_report` reads first, last)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from thunderfx_debug import layout
from thunderfx_debug.artifacts.artifact import Artifact, ArtifactSettings
from thunderfx_debug.artifacts.repro.builder import pieces_with_scripts, scripts_for_graph
from thunderfx_debug.artifacts.report_builder import build_report
from thunderfx_debug.progress import progress
from thunderfx_debug.records import SCHEMA_VERSION, Phase, RankRecord
from thunderfx_debug.recording.recorder import GraphSnapshot
from thunderfx_debug.render.chrome_trace import chrome_trace
from thunderfx_debug.report import Report
from thunderfx_debug.safety import ReportingFailures

DumpFiles = list[tuple[str, str | bytes]]


def dump_files(snapshots: list[GraphSnapshot], meta: Mapping[str, Any], settings: ArtifactSettings,
               failures: ReportingFailures, show_progress: bool = False) -> tuple[Report, DumpFiles]:
    """The report and the files of a dump: traces, repro scripts (as `settings` ask; a graph that failed under
    Thunder gets the scripts of its failing piece regardless), graph.json per graph, summary.txt, trace.json and
    manifest.json. A piece whose artifacts cannot be made is a reporting failure; the others are still made.
    `show_progress`: progress of the scripts (`progress`: a bar on a terminal, log lines otherwise) where making
    them takes more than a second."""
    artifacts: list[Artifact] = []
    for snapshot in snapshots:
        with failures.guard(f"collecting the traces of {snapshot.state.name}"):
            artifacts += trace_artifacts(snapshot)
    with_scripts = [s for s in snapshots if settings.repro or s.state.error]
    pieces = 0
    with failures.guard("counting the pieces that get repro scripts"):
        pieces = sum(len(pieces_with_scripts(s, settings)) for s in with_scripts)
    with progress(pieces, "writing repro scripts", unit="piece", enabled=show_progress) as step:
        for snapshot in with_scripts:
            with failures.guard(f"writing the repro scripts of {snapshot.state.name}"):
                artifacts += scripts_for_graph(snapshot, settings, failures, on_piece=step)
    index: dict[str, dict[str, str]] = {}
    for artifact in artifacts:
        index.setdefault(artifact.owner, {})[artifact.label] = artifact.path
    report = build_report(snapshots, index, meta, failures)

    files: DumpFiles = [(a.path, a.content) for a in artifacts]
    files += [(f"{layout.graph_dir(g.name)}/{layout.GRAPH_JSON}", _json(g.to_json())) for g in report.graphs]
    files.append((layout.SUMMARY, str(report)))
    with failures.guard("rendering trace.json"):
        files.append((layout.CHROME_TRACE, _json(chrome_trace(report))))
    files.append((layout.MANIFEST, _json(manifest_json(report))))
    return report, files


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=False, default=str) + "\n"


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
                artifacts.append(Artifact(f"{graph}/{split.state.name}", label, path, text))
    return artifacts
