"""TORCH_TRACE: the backend's records as artifacts of torch's structured trace log, filed by tlparse under each
graph's compile id; nothing written without it; nothing filed under a compile that is not the graph's."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from torch._guards import CompileContext, CompileId, TraceId, compile_context

from conftest import dump_fixtures
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.artifacts import torch_trace as artifacts
from thunderfx_debug.records import Check
from thunderfx_debug.thunder import torch_trace

HERE = Path(__file__).parent


def _tlparse() -> str | None:
    """tlparse from the test extras: the venv's scripts folder, else PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "tlparse"
    return str(beside) if beside.is_file() else shutil.which("tlparse")


@pytest.mark.skipif(_tlparse() is None, reason="tlparse is not installed (pip install -e '.[test]' installs it)")
def test_tlparse_files_the_records_under_each_graphs_compile_id(tmp_path):
    trace_dir, dump_dir, out = tmp_path / "trace", tmp_path / "dump", tmp_path / "tlparse"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THUNDERFX_DEBUG_", "TORCH_"))}
    done = subprocess.run([sys.executable, str(HERE / "traced_run.py"), str(dump_dir)], capture_output=True, text=True,
                          env={**env, "TORCH_TRACE": str(trace_dir)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = trace_dir.glob("dedicated_log_torch_trace_*.log")
    # --strict: every line of the log, ours included, must parse.
    parsed = subprocess.run([_tlparse(), str(log), "-o", str(out), "--overwrite", "--no-browser", "--strict"],
                            capture_output=True, text=True, timeout=120)
    assert parsed.returncode == 0, parsed.stderr[-3000:]

    report = load_report(dump_dir)
    directory = json.loads((out / "compile_directory.json").read_text())
    ours = {key: [a for a in entry["artifacts"] if a["name"].startswith("thunderfx_debug_")]
            for key, entry in directory.items()}
    assert len({g.compile_id for g in report.graphs}) == 2  # the graph break: two graphs, two compile ids
    # tlparse keys a compile by its trace id: "[0/0]", or "[0/0_1]" for the attempt after Dynamo restarted its
    # analysis (as it does at a graph break). Ours are under the graphs' compiles only: nothing under Thunder's
    # nested torch.compile calls (TorchCompileN regions), nothing under no compile id.
    with_ours = {key: key.strip("[]").split("_")[0] for key, found in ours.items() if found}
    assert sorted(with_ours.values()) == sorted(g.compile_id for g in report.graphs)
    for key, compile_id in with_ours.items():
        graph = next(g for g in report.graphs if g.compile_id == compile_id)
        urls = {a["name"].rsplit("_", 1)[0]: a["url"] for a in ours[key]}
        dynamo = [a["url"] for a in directory[key]["artifacts"] if a["name"].startswith("dynamo_output_graph")]
        folder = dynamo[0].split("/")[0]  # Dynamo's own folder of this compile, "-_0_0_0"
        assert all(url.split("/")[0] == folder for url in urls.values()), urls
        thunder_splits = [s for s in graph.splits if s.kind.value == "thunder"]
        expected = {f"thunderfx_debug_{graph.name}_{name}" for name in ("splits", "timing")}
        expected |= {f"thunderfx_debug_{graph.name}_{s.name}_{what}" for s in thunder_splits
                     for what in ("fwd_trace", "bwd_trace", "fusions")}
        assert set(urls) == expected  # each once: the second flush changed nothing, so it wrote nothing

        def read(what: str):
            text = (out / urls[f"thunderfx_debug_{graph.name}_{what}"]).read_text()
            return text if what.endswith("_trace") else json.loads(text)

        splits = read("splits")
        assert splits["compile_id"] == graph.compile_id
        assert [(s["name"], s["kind"]) for s in splits["splits"]] == [(s.name, s.kind.value) for s in graph.splits]
        assert [r["type"] for s in splits["splits"] for r in s["reasons"]] == [r.type for r in graph.reasons]
        for split in thunder_splits:
            assert read(f"{split.name}_fwd_trace") == split.fwd_trace
            assert read(f"{split.name}_bwd_trace") == split.bwd_trace
            assert [(f["name"], f["phase"], f["ops"]) for f in read(f"{split.name}_fusions")] == [
                (f.name, f.phase.value, list(f.ops)) for f in split.fusions]
        timing = read("timing")
        assert timing["calls"] == graph.calls == 3
        assert timing["forward"]["count"] == graph.timing.count
        assert timing["forward"]["median_ms"] == pytest.approx(graph.timing.median_ms)
        fusion_counts = [f["timing"]["count"] for s in timing["splits"] for f in s["fusions"]]
        assert fusion_counts == [f.timing.count for s in graph.splits for f in s.fusions]
    reasons = [r for g in report.graphs for r in g.reasons]
    assert [r.op for r in reasons] == ["torch.sinc"]
    assert any(s.fusions for g in report.graphs for s in g.splits)


@pytest.fixture
def written(monkeypatch):
    """Every artifact the package writes into the trace log: (name, encoding, payload, compile in progress)."""
    calls = []

    def record(kind, metadata_fn, *, payload_fn, **_):
        calls.append((metadata_fn()["name"], metadata_fn()["encoding"], payload_fn(),
                      CompileContext.current_trace_id()))

    monkeypatch.setattr(torch_trace, "trace_structured", record)
    return calls


def _train(backend: ReportingBackend, steps: int = 2) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    compiled = torch.compile(model, backend=backend)
    for _ in range(steps):
        compiled(torch.randn(4, 8)).sum().backward()


@pytest.mark.skipif(torch_trace.tracing_enabled(), reason="this test process has TORCH_TRACE on")
def test_without_torch_trace_nothing_is_made_or_written(tmp_path, written, monkeypatch):
    backend = ReportingBackend(dump_dir=tmp_path / "off", strict=True)
    assert backend._torch_trace is None  # no emitter: the first call of a graph runs no hook
    _train(backend)
    backend.flush()
    assert written == []
    # The same run with tracing on writes; so the count above could have been other than 0.
    torch._dynamo.reset()
    monkeypatch.setattr("thunderfx_debug.run.backend.tracing_enabled", lambda: True)
    backend = ReportingBackend(strict=True)  # no dump dir: flush writes only into the trace log
    _train(backend)
    assert {name for name, *_ in written} >= {"thunderfx_debug_graph0_splits", "thunderfx_debug_graph0_thunder_0_fusions"}
    assert "thunderfx_debug_graph0_timing" not in {name for name, *_ in written}  # timing comes at flush
    backend.flush()
    assert "thunderfx_debug_graph0_timing" in {name for name, *_ in written}
    graph = backend.report().graphs[0]
    assert {trace_id for *_, trace_id in written} == {TraceId(CompileId.from_string(graph.compile_id), 0)}


def test_flush_writes_only_what_changed_and_never_under_another_compile(written):
    report = load_report(dump_fixtures() / "normal")
    emitter = artifacts.TorchTraceEmitter(_RecorderStub())
    nested = CompileContext(CompileId(frame_id=9, frame_compile_id=0))  # Thunder compiling a fusion, say
    with compile_context(nested):
        emitter.flushed(report.graphs)
    assert written == []  # nothing filed under the nested compile; kept for the next flush
    emitter.flushed(report.graphs)
    names = [name for name, *_ in written]
    assert len(names) == len(set(names)) > 0
    for name, encoding, payload, trace_id in written:
        graph = next(g for g in report.graphs if name.startswith(f"thunderfx_debug_{g.name}_"))
        assert trace_id == TraceId(CompileId.from_string(graph.compile_id), 0), name
        assert encoding == ("string" if name.endswith("_trace") else "json")
        if encoding == "json":
            json.loads(payload)
    written.clear()
    emitter.flushed(report.graphs)
    assert written == []  # nothing changed, nothing written
    slower = _with_split(report, "graph0", "thunder_0", timing=_scaled(report.graphs[0].splits[0].timing, 2.0))
    emitter.flushed(slower.graphs)
    assert [name for name, *_ in written] == ["thunderfx_debug_graph0_timing"]


def test_checks_are_written_where_a_record_has_one():
    report = load_report(dump_fixtures() / "normal")
    graph = report.graphs[0]
    assert [name for name, _ in artifacts.summary_artifacts(graph)] == ["thunderfx_debug_graph0_timing"]
    check = Check(calls=3, mismatches=1, worst_abs_error=0.5)
    split = graph.splits[0]
    checked = dataclasses.replace(graph, splits=(dataclasses.replace(split, check=check), *graph.splits[1:]))
    found = dict(artifacts.summary_artifacts(checked))
    assert found["thunderfx_debug_graph0_check"]["splits"] == [
        {"name": split.name, "check": check.to_json(), "fusions": []}]


def test_artifact_names_stay_file_names():
    assert torch_trace.artifact_name("graph0", "../thunder 0") == "thunderfx_debug_graph0_.._thunder_0"


class _RecorderStub:
    """What the emitter reads of a recorder at flush: its failures (records come from the fixture)."""

    def __init__(self):
        from thunderfx_debug.settings.safety import ReportingFailures

        self.failures = ReportingFailures(strict=True)


def _scaled(timing, factor):
    return dataclasses.replace(timing, samples_ms=tuple(s * factor for s in timing.samples_ms))


def _with_split(report, graph_name, split_name, **changes):
    graphs = []
    for g in report.graphs:
        if g.name == graph_name:
            g = dataclasses.replace(g, splits=tuple(dataclasses.replace(s, **changes) if s.name == split_name else s
                                                    for s in g.splits))
        graphs.append(g)
    return dataclasses.replace(report, graphs=tuple(graphs))
