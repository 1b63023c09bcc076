"""Dumps survive a kill in the middle of a flush, and hostile dumps are refused clearly: `load_report` and the CLI
never execute code from a dump, never read or write outside it (not through '..', absolute paths or symbolic
links), and damaged JSON, wrong types or another schema version give a DumpError that says what is wrong.

The hostile dumps start from a small valid dump written from records (no Thunder); the kill test runs a real
training subprocess (tests/flush_and_die.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from thunderfx_debug.records import layout
from thunderfx_debug.artifacts.dump_contents import manifest_json
from thunderfx_debug.dump.files import load_report, load_reports, write_files
from thunderfx_debug.render.report import Report
from thunderfx_debug.records import (
    SCHEMA_VERSION,
    DumpError,
    FusionRecord,
    GraphRecord,
    Phase,
    SplitKind,
    SplitReason,
    SplitRecord,
    Timing,
)

TESTS = Path(__file__).parent
CLI = Path(sys.executable).with_name("thunderfx-debug")
SECRET = "SECRET-OUTSIDE-THE-DUMP-7f3a"
FWD_TRACE = "# the forward trace\ndef computation(x):\n  return x\n"


def write_valid_dump(root: Path) -> Path:
    """A small dump as ReportingBackend writes it: one graph with a thunder split (traces, a fusion, timing) and an
    inductor split (a split reason). Returns the rank directory."""
    timing = Timing(samples_ms=(1.0, 2.0, 4.0), calls=(6, 11, 16), clock="host")
    thunder_dir = layout.split_dir("graph0", "thunder_0")
    thunder = SplitRecord(
        name="thunder_0",
        kind=SplitKind.THUNDER,
        ops=("torch.sin", "operator.add"),
        fusions=(FusionRecord(name="TorchCompile0", executor="torchcompile", phase=Phase.FORWARD, ops=("sin", "add"),
                              timing=timing),),
        timing=timing,
        files={"fwd_trace": f"{thunder_dir}/fwd_trace.py"},
    )
    inductor = SplitRecord(
        name="inductor_1",
        kind=SplitKind.INDUCTOR,
        ops=("torch.sinc",),
        reasons=(SplitReason(type="MISSING_OP_SUPPORT", info="node with name: sinc and target: torch.sinc only has",
                             node="sinc", op="torch.sinc"),),
    )
    graph = GraphRecord(name="graph0", index=0, compile_id="0/0", splits=(thunder, inductor), calls=16, timing=timing)
    report = Report(graphs=(graph,), meta={"rank": 0, "world_size": 1, "flushes": 1, "config": {}, "versions": {},
                                           "environment": {}, "warnings": [], "reporting_failures": []})
    rank_dir = root / "rank0"
    write_files(rank_dir, [
        (f"{thunder_dir}/fwd_trace.py", FWD_TRACE),
        ("graph0/graph.json", json.dumps(graph.to_json())),
        (layout.SUMMARY, str(report)),
        (layout.MANIFEST, json.dumps(manifest_json(report))),
    ])
    return rank_dir


@pytest.fixture
def dump(tmp_path) -> Path:
    """A valid dump at tmp_path/dump, and a secret file next to it (outside the dump) that must never be read."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    (tmp_path / "outside" / "graph.json").write_text(json.dumps({"name": SECRET, "index": 0}))
    root = tmp_path / "dump"
    write_valid_dump(root)
    return root


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_valid_dump_loads(dump):
    report = load_report(dump)
    assert [s.name for s in report.graphs[0].splits] == ["thunder_0", "inductor_1"]
    assert report.graphs[0].splits[0].fwd_trace == FWD_TRACE
    assert report.graphs[0].splits[0].fusions[0].timing.count == 3


# ---- paths that leave the dump -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../../outside/graph.json", "/etc/passwd", "graph0/../../outside/graph.json",
                                  "graph0\\..\\..\\outside\\graph.json", ""])
def test_manifest_graph_path_outside_the_dump_is_refused(dump, path):
    _edit_json(dump / "rank0" / "manifest.json", lambda m: m["graphs"][0].update(path=path))
    with pytest.raises(DumpError, match=r"manifest.json: graphs\[0\]: .*(not a relative path|not allowed)"):
        load_report(dump)


@pytest.mark.parametrize("path", ["../../outside/secret.txt", "/tmp/x/secret.txt", "graph0/../../../outside/secret.txt"])
def test_trace_path_outside_the_dump_is_refused(dump, path):
    _edit_json(dump / "rank0" / "graph0" / "graph.json", lambda g: g["splits"][0]["files"].update(fwd_trace=path))
    with pytest.raises(DumpError, match=r"thunder_0\.files\.fwd_trace: .*(not a relative path|not allowed)"):
        load_report(dump)


def test_symbolic_links_out_of_the_dump_are_not_followed(dump):
    outside = dump.parent / "outside"
    trace = dump / "rank0" / "graph0" / "graph0_thunder_0" / "fwd_trace.py"
    trace.unlink()
    trace.symlink_to(outside / "secret.txt")
    with pytest.raises(DumpError, match="leads outside the dump through a symbolic link"):
        load_report(dump)
    trace.unlink()

    graph_json = dump / "rank0" / "graph0" / "graph.json"
    graph_json.unlink()
    graph_json.symlink_to(outside / "graph.json")
    with pytest.raises(DumpError, match="leads outside the dump through a symbolic link"):
        load_report(dump)

    # A rank directory that is a link out of the dump is not one of its ranks.
    linked = dump.parent / "elsewhere" / "rank1"
    shutil.copytree(dump / "rank0", linked, symlinks=True)
    (dump / "rank1").symlink_to(linked, target_is_directory=True)
    shutil.rmtree(dump / "rank0")
    with pytest.raises(DumpError, match="holds no dump"):
        load_report(dump)


def test_a_link_inside_the_dump_is_fine(dump):
    trace = dump / "rank0" / "graph0" / "graph0_thunder_0" / "fwd_trace.py"
    (dump / "rank0" / "shared_trace.py").write_text(FWD_TRACE)
    trace.unlink()
    trace.symlink_to(dump / "rank0" / "shared_trace.py")
    assert load_report(dump).graphs[0].splits[0].fwd_trace == FWD_TRACE


def test_cli_neither_executes_nor_reads_nor_writes_outside(dump, tmp_path):
    """A dump full of traps: Python files that would leave a mark if imported or run, '..' and links to a secret,
    and a link where the HTML report is written by default. The CLI reads it without springing any."""
    marker = tmp_path / "executed"
    trap = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("json.py", "thunderfx_debug.py", "sitecustomize.py", "usercustomize.py", "records.py", "__main__.py"):
        (dump / name).write_text(trap)
        (dump / "rank0" / name).write_text(trap)
    (dump / "rank0" / "graph0" / "graph0_repro_eager.py").write_text(trap)
    _edit_json(dump / "rank0" / "graph0" / "graph.json",
               lambda g: g["files"].update(repro_eager="graph0/graph0_repro_eager.py", evil="../../outside/secret.txt"))
    victim = tmp_path / "outside" / "victim.txt"
    victim.write_text("untouched")
    (dump / "report.html").symlink_to(victim)

    summary = _cli("summary", str(dump), cwd=dump)
    assert summary.returncode == 0, summary.stderr
    assert "graph0" in summary.stdout and SECRET not in summary.stdout

    html = _cli("html", str(dump), cwd=dump / "rank0")
    if html.returncode == 0:
        written = Path(html.stdout.strip().splitlines()[-1])
        assert SECRET not in written.read_text()
    assert victim.read_text() == "untouched", "the HTML report was written through a link out of the dump"
    assert not marker.exists(), marker.read_text()


# ---- damaged and foreign dumps --------------------------------------------------------------------------------------


def _damage(dump: Path, kind: str) -> None:
    manifest, graph = dump / "rank0" / "manifest.json", dump / "rank0" / "graph0" / "graph.json"
    if kind == "truncated manifest":
        manifest.write_text(manifest.read_text()[:40])
    elif kind == "manifest cut in a string":
        manifest.write_text('{"schema_version": 2, "run_id": "abc')
    elif kind == "manifest is a list":
        manifest.write_text("[1, 2]")
    elif kind == "binary manifest":
        manifest.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "deeply nested":
        manifest.write_text("[" * 200000 + "]" * 200000)
    elif kind == "unknown schema version":
        _edit_json(manifest, lambda m: m.update(schema_version=SCHEMA_VERSION + 98, versions="not a dict"))
    elif kind == "schema version true":
        _edit_json(manifest, lambda m: m.update(schema_version=True))
    elif kind == "graphs not a list":
        _edit_json(manifest, lambda m: m.update(graphs={"graph0": "graph0/graph.json"}))
    elif kind == "rank not an integer":
        _edit_json(manifest, lambda m: m.update(rank="zero"))
    elif kind == "config not an object":
        _edit_json(manifest, lambda m: m.update(config=["timing"]))
    elif kind == "graph file missing":
        graph.unlink()
    elif kind == "graph file is a directory":
        graph.unlink()
        graph.mkdir()
    elif kind == "graph file is a FIFO":
        graph.unlink()
        os.mkfifo(graph)
    elif kind == "truncated graph":
        graph.write_text(graph.read_text()[:100])
    elif kind == "index is a string":
        _edit_json(graph, lambda g: g.update(index="zero"))
    elif kind == "calls is a bool":
        _edit_json(graph, lambda g: g.update(calls=True))
    elif kind == "split kind unknown":
        _edit_json(graph, lambda g: g["splits"][0].update(kind="tvm"))
    elif kind == "samples not numbers":
        _edit_json(graph, lambda g: g["timing"].update(samples_ms=["fast"]))
    elif kind == "splits not a list":
        _edit_json(graph, lambda g: g.update(splits="thunder_0"))
    else:
        raise AssertionError(kind)


DAMAGE = {
    "truncated manifest": r"manifest.json is damaged: not valid JSON \(.* at line 1, column \d+\)",
    "manifest cut in a string": r"not valid JSON \(Unterminated string starting at line 1, column 33\)",
    "manifest is a list": r"manifest.json is damaged: expected a JSON object",
    "binary manifest": r"manifest.json cannot be read",
    "deeply nested": r"manifest.json is damaged: its JSON is nested too deeply",
    "unknown schema version": rf"schema version {SCHEMA_VERSION + 98}; this thunderfx_debug reads version "
                              rf"{SCHEMA_VERSION}.*\(unknown\)",
    "schema version true": r"schema version True",
    "graphs not a list": r"'graphs' must be a list",
    "rank not an integer": r"'rank' must be a JSON integer, found 'zero'",
    "config not an object": r"'config' must be a JSON object",
    "graph file missing": r"graph.json is missing: listed in manifest.json",
    "graph file is a directory": r"graph.json is not a regular file",
    "graph file is a FIFO": r"graph.json is not a regular file",
    "truncated graph": r"graph.json is damaged: not valid JSON",
    "index is a string": r"graph.json\.index: expected int, found str 'zero'",
    "calls is a bool": r"graph.json\.calls: expected int, found bool",
    "split kind unknown": r"splits\[0\]\.kind: 'tvm' is not one of 'thunder', 'inductor'",
    "samples not numbers": r"timing\.samples_ms: expected a list of numbers",
    "splits not a list": r"graph.json\.splits: expected list, found str",
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_dump_gives_a_clear_dump_error(dump, kind):
    _damage(dump, kind)
    with pytest.raises(DumpError, match=DAMAGE[kind]):
        load_report(dump)


@pytest.mark.parametrize("kind", ["truncated manifest", "unknown schema version", "graph file is a FIFO",
                                  "index is a string", "deeply nested"])
def test_cli_reports_a_damaged_dump_in_one_line(dump, kind):
    _damage(dump, kind)
    done = _cli("summary", str(dump), cwd=dump.parent)
    assert done.returncode == 2
    assert done.stderr.startswith("thunderfx-debug summary: ") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_missing_or_empty_directories(tmp_path):
    with pytest.raises(DumpError, match="does not exist"):
        load_report(tmp_path / "nothing")
    with pytest.raises(DumpError, match="holds no dump"):
        load_report(tmp_path)
    (tmp_path / "file").write_text("{}")
    with pytest.raises(DumpError, match="is not a directory"):
        load_report(tmp_path / "file")


# ---- a kill in the middle of a flush ------------------------------------------------------------------------------


def _read_lines(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.strip())


def test_sigkill_in_the_middle_of_a_flush_leaves_the_previous_dump_readable(tmp_path):
    """A real training process flushes over and over. While it does, the dump always loads (what a kill at any of
    those moments would leave); then it is SIGKILLed inside a flush whose every file but the manifest is already
    renamed into place, and the dump still loads: the manifest of the last complete flush."""
    dump, stall = tmp_path / "dump", tmp_path / "stall"
    child = subprocess.Popen(
        [sys.executable, str(TESTS / "flush_and_die.py"), str(dump), str(stall)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while "flushed 1" not in lines:
            assert child.poll() is None and time.monotonic() < deadline, f"the child died or hung: {lines}"
            time.sleep(0.1)
        loads = 0
        while loads < 40 or sum(line.startswith("flushed") for line in lines) < 4:
            assert child.poll() is None and time.monotonic() < deadline, f"the child died or hung: {lines}"
            load_report(dump)  # concurrently with the flushes: never a half-written state
            loads += 1
        stall.touch()
        while "stalled" not in lines:
            assert child.poll() is None and time.monotonic() < deadline, f"the child died or hung: {lines}"
            time.sleep(0.05)
        completed = sum(line.startswith("flushed") for line in lines)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    report = load_report(dump)
    assert report.meta["flushes"] == completed  # the manifest of the last complete flush
    # ... indexing files of that flush or, already renamed, of the killed one: complete either way.
    assert report.graphs[0].calls in (completed, completed + 1)
    assert report.graphs[0].splits[0].fwd_trace
    leftovers = [p.name for p in (dump / "rank0").iterdir() if p.name.endswith(".tmp")]
    assert leftovers and all(p.startswith(".manifest.json.") for p in leftovers)  # the killed flush's manifest
    assert load_reports(dump).keys() == {0}


def test_a_dump_of_the_previous_format_still_loads():
    """tests/fixtures/previous_format: a dump written before the inputs' records knew storage sizes, sentinels and
    mask densities (the fields default)."""
    from conftest import dump_fixtures

    report = load_report(dump_fixtures() / "previous_format" / "rank0")
    metas = [m for g in report.graphs for m in g.input_meta]
    assert metas and all(m.storage_size is None and m.sentinel is None for m in metas)
    assert any(m.min_value is not None for m in metas)
