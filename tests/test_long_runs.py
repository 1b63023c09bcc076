"""Production runs: days long, preempted, killed, restarted.

- Bounded samples: a piece keeps the first samples, a uniform sample and the most recent ones raw, totals over all of
  them and a time series; checked on fake clocks with exact expected values, and on a real Thunder soak (thousands
  of steps, every call sampled) whose memory stays flat (tracemalloc) and whose dump stays the same size.
- Periodic flushes from the training path, writing only the files that changed.
- SIGKILL at a random moment after the first periodic flush leaves a dump that loads; SIGTERM flushes and then runs
  the handler installed before (or the default action); a second run into the same directory keeps the first's dump
  under runs/<run id>/, which the command line lists and diffs. Real training subprocesses (tests/long_run.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.artifacts.dump_contents import manifest_json
from thunderfx_debug.dump.files import list_runs, move_earlier_run_aside, write_files
from thunderfx_debug.records import DumpError, GraphRecord, Timing
from thunderfx_debug.recording.samples import SampleStream, WindowSeries
from thunderfx_debug.recording.timing import HostClock, SampleSeries
from thunderfx_debug.render.summary import render_summary
from thunderfx_debug.render.report import Report
from thunderfx_debug.dump.runs import derive_run_id
from thunderfx_debug.run.sigterm import chain_sigterm

TESTS = Path(__file__).parent
CLI = Path(sys.executable).with_name("thunderfx-debug")
MS = 1_000_000  # nanoseconds


# ---- bounded samples, on fake clocks ------------------------------------------------------------------------------
def test_a_stream_keeps_the_first_a_uniform_sample_and_the_recent_samples_and_totals_over_all():
    stream = SampleStream(first=4, reservoir=16, recent=8)
    values = [float(i % 7) + (100.0 if i == 50_000 else 0.0) for i in range(100_000)]
    for call, ms in enumerate(values, start=1):
        stream.add(call, ms)
    assert (stream.count, stream.total_ms, stream.min_ms, stream.max_ms) == (100_000, sum(values), 0.0, 106.0)
    kept_calls = [call for _, call, _ in stream.kept()]
    assert kept_calls[:4] == [1, 2, 3, 4] and kept_calls[-8:] == list(range(99_993, 100_001))
    assert len(kept_calls) <= 4 + 16 + 8
    uniform = [call for _, call, _ in stream.uniform()]
    assert len(uniform) == 16 and not stream.complete
    # Uniform over the whole run (algorithm R): not crowded at the start or the end, unlike first and recent.
    assert 2 <= sum(call <= 50_000 for call in uniform) <= 14


def test_a_short_stream_keeps_everything():
    stream = SampleStream(first=2, reservoir=5, recent=2)
    for call in (6, 11, 16):
        stream.add(call, float(call))
    assert stream.complete and [(c, ms) for _, c, ms in stream.kept()] == [(6, 6.0), (11, 11.0), (16, 16.0)]


def test_windows_halve_by_merging_neighbours_and_show_a_slowdown():
    series = WindowSeries(max_windows=8, values=4)
    for call in range(1, 1001):
        series.add(call, 2.0 if 600 < call <= 900 else 1.0)  # a slowdown for 300 calls
    windows = series.windows()
    widths = {w.count for w in windows[:-1]}
    assert len(widths) == 1 and 4 <= len(windows) - 1 <= 8 and series.width == widths.pop()
    assert sum(w.count for w in windows) == 1000
    assert [w.first_call for w in windows] == [1 + i * series.width for i in range(len(windows))]
    assert windows[-1].last_call == 1000
    slow = [w for w in windows if w.median_ms == 2.0]
    assert len(slow) >= 2 and all(600 - series.width < w.first_call and w.last_call <= 900 + series.width
                                  for w in slow)
    assert max(w.max_ms for w in windows) == 2.0
    assert all(w.median_ms == 1.0 for w in windows if w.last_call <= 600 or w.first_call > 900)


def test_the_timing_of_a_long_series_counts_every_sample_and_estimates_quantiles_from_the_uniform_sample():
    ticks = iter(range(0, 10**12, MS))  # marks one millisecond apart: each sample is 1 ms ...
    series = SampleSeries(HostClock(counter=lambda: next(ticks)), SampleStream(first=2, reservoir=8, recent=2))
    for call in range(1, 1001):
        start = series.clock.mark()
        if call == 500:
            for _ in range(9):  # ... but one, of 10 ms
                series.clock.mark()
        series.add(call, start, series.clock.mark())
    series.resolve()
    timing = series.timing()
    assert timing.count == 1000 and timing.total_ms == pytest.approx(1009.0) and timing.max_ms == 10.0
    assert timing.min_ms == 1.0 and timing.mean_ms == pytest.approx(1.009)
    assert not timing.complete and len(timing.uniform_samples_ms) == 8 and timing.median_ms == 1.0
    assert timing.calls[:2] == (1, 2) and timing.calls[-2:] == (999, 1000)
    assert series.timing() is timing  # nothing new: the same record


def test_timing_json_round_trip_and_version_1_timings():
    stream = SampleStream(first=2, reservoir=4, recent=2)
    series = SampleSeries(HostClock(), stream)
    for call in range(1, 101):
        stream.add(call, float(call))
    timing = series.timing()
    again = Timing.from_json(json.loads(json.dumps(timing.to_json())), "t")
    assert again == timing and again.stats() == timing.stats() and again.count == 100 and again.windows
    # A version 1 timing: raw samples only, every one of them.
    old = Timing.from_json({"clock": "host", "samples_ms": [1.0, 3.0], "calls": [6, 11], "count": 2}, "t")
    assert old.complete and (old.count, old.median_ms, old.total_ms, old.windows) == (2, 2.0, 4.0, ())


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.update(count=1), r"t\.count: 1 samples in all, fewer than"),
    (lambda d: d.update(uniform=[0, 99]), r"t\.uniform: expected distinct indices"),
    (lambda d: d["windows"].update(count=[1]), r"t\.windows: its columns .* same length"),
    (lambda d: d["windows"].update(median_ms=["x"] * len(d["windows"]["median_ms"])), r"t\.windows\.median_ms"),
])
def test_a_damaged_bounded_timing_names_the_field(damage, message):
    stream = SampleStream(first=1, reservoir=2, recent=1)
    for call in range(1, 11):
        stream.add(call, 1.0)
    data = SampleSeries(HostClock(), stream).timing().to_json()
    damage(data)
    with pytest.raises(DumpError, match=message):
        Timing.from_json(data, "t")


def test_the_html_page_charts_the_time_over_the_run():
    from thunderfx_debug.render.html import render_html

    stream = SampleStream()
    for call in range(1, 5001):
        stream.add(call, 3.0 if call > 4000 else 1.0)
    timing = SampleSeries(HostClock(), stream).timing()
    report = Report(graphs=(GraphRecord(name="graph0", index=0, calls=5000, timing=timing),), meta={"rank": 0})
    page = render_html({0: report})
    chart = page[page.index("<h4>Time over the run</h4>"):]
    assert "<h5>graph0 forward</h5>" in chart and "<title>median</title>" in chart and "<polyline" in chart
    # the last fifth of the run, three times slower, is a level on the axis, not outliers on its top edge
    assert 'text-anchor="end">3</text>' in chart and "outlier" not in chart
    assert "A long run keeps some of its samples raw" in page
    summary = render_summary(report)
    assert "over 5000 samples" in summary and "quantiles from a uniform sample of 128" in summary
    assert "last 3.000 ms" in summary and summary.rstrip().endswith("  [---------------@@@@@]")


# ---- run ids and earlier runs -------------------------------------------------------------------------------------
def test_run_ids_that_every_rank_of_a_job_derives_alike():
    import datetime

    def run_id(**environ):
        return derive_run_id(environ, now=datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc), host="n1",
                             pid=11, parent_pid=10)

    assert run_id(TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="2") == "torchrun-n1-10-restart2"
    assert run_id(SLURM_JOB_ID="77", SLURM_STEP_ID="0", TORCHELASTIC_RUN_ID="77",
                  TORCHELASTIC_RESTART_COUNT="0") == "slurm77.0-restart0"
    assert run_id(TORCHELASTIC_RUN_ID="my job/1", TORCHELASTIC_RESTART_COUNT="0") == "my_job_1-restart0"
    assert run_id() == "20260102T000000Z-n1-11"


def _dump(root: Path, run_id: str | None, started: str, process_uid: str = "someone-else", calls: int = 4) -> Path:
    graph = GraphRecord(name="graph0", index=0, compile_id="0/0", calls=calls,
                        timing=Timing((1.0, 2.0, 1.5), (1, 2, 3), "host"))
    meta = {"rank": 0, "flushes": 1, "written_at": started, "run_started_at": started, "process_uid": process_uid}
    if run_id is not None:
        meta["run_id"] = run_id
    report = Report(graphs=(graph,), meta=meta)
    rank_dir = root / "rank0"
    write_files(rank_dir, [("graph0/graph.json", json.dumps(graph.to_json())),
                           ("manifest.json", json.dumps(manifest_json(report)))])
    return rank_dir


def test_an_earlier_run_moves_aside_atomically_and_a_run_keeps_its_own(tmp_path):
    _dump(tmp_path, "job-restart0", "2026-01-01T00:00:00+00:00")
    moved = move_earlier_run_aside(tmp_path, 0, "me")
    assert moved == tmp_path / "runs" / "job-restart0" / "rank0" and not (tmp_path / "rank0").exists()
    assert load_report(moved).meta["run_id"] == "job-restart0"
    _dump(tmp_path, "job-restart0", "2026-01-02T00:00:00+00:00")  # a launcher that reused the run id
    assert move_earlier_run_aside(tmp_path, 0, "me") == tmp_path / "runs" / "job-restart0.2" / "rank0"
    _dump(tmp_path, None, "2026-01-03T00:00:00+00:00")  # a dump from before run ids
    assert move_earlier_run_aside(tmp_path, 0, "me").parent.name.startswith("unknown-")
    _dump(tmp_path, "job-restart1", "2026-01-04T00:00:00+00:00", process_uid="me")
    assert move_earlier_run_aside(tmp_path, 0, "me") is None and (tmp_path / "rank0").is_dir()  # our own dump

    runs = list_runs(tmp_path)
    assert [r.run_id for r in runs] == ["job-restart0", "job-restart0", None, "job-restart1"]
    assert [r.latest for r in runs] == [False, False, False, True] and runs[-1].path == tmp_path


def test_the_cli_lists_runs_and_diffs_consecutive_ones(tmp_path):
    _dump(tmp_path, "job-restart0", "2026-01-01T00:00:00+00:00", calls=4)
    move_earlier_run_aside(tmp_path, 0, "me")
    _dump(tmp_path, "job-restart1", "2026-01-02T00:00:00+00:00", calls=9)
    listed = subprocess.run([str(CLI), "runs", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert "job-restart0" in lines[2] and "runs/job-restart0" in lines[2] and "job-restart1 (latest)" in lines[3]
    diffed = subprocess.run([str(CLI), "diff", str(tmp_path), "--runs"], capture_output=True, text=True, timeout=120)
    assert diffed.returncode == 0, diffed.stderr
    assert "A = run job-restart0" in diffed.stdout and "B = run job-restart1" in diffed.stdout
    unknown = subprocess.run([str(CLI), "diff", str(tmp_path), "--runs", "job-restart0", "nope"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "has no run nope" in unknown.stderr and len(unknown.stderr.splitlines()) == 1


# ---- SIGTERM chaining, in this process ----------------------------------------------------------------------------
def test_sigterm_flushes_then_runs_the_handler_installed_before():
    original = signal.getsignal(signal.SIGTERM)
    calls = []
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(("user", signum)))

        def on_sigterm(then):
            calls.append(("flush", None))
            then()

        assert chain_sigterm(on_sigterm)
        signal.raise_signal(signal.SIGTERM)
        assert calls == [("flush", None), ("user", signal.SIGTERM)]
        installed = []
        thread = threading.Thread(target=lambda: installed.append(chain_sigterm(on_sigterm)))
        thread.start()
        thread.join()
        assert installed == [False]  # Python handles signals in the main thread only
    finally:
        signal.signal(signal.SIGTERM, original)


# ---- a real soak ----------------------------------------------------------------------------------------------------
def _tiny_training(backend):
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    compiled = torch.compile(f, backend=backend)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)

    def steps(n):
        for _ in range(n):
            compiled(x, w).backward()

    return steps


def _dump_bytes(rank_dir: Path) -> int:
    return sum(p.stat().st_size for p in rank_dir.rglob("*") if p.is_file())


def test_soak_every_call_sampled_memory_flat_and_dump_bounded(tmp_path):
    """3,000 then 3,000 more steps, every call timed (graph and split, forward and backward): the recorder's memory
    does not grow between the two, the dump keeps its size, and every sample is counted."""
    backend = ReportingBackend(dump_dir=tmp_path, timing="split", timing_every=1, timing_warmup=0, strict=True,
                               flush_every=0)
    steps = _tiny_training(backend)
    steps(1500)
    backend.flush()  # caches, the dump writer: what later flushes reuse
    tracemalloc.start()
    try:
        steps(1500)
        rank_dir = backend.flush()
        size_at_3000, (memory_at_3000, _) = _dump_bytes(rank_dir), tracemalloc.get_traced_memory()
        disturbed_at_3000 = len(load_report(rank_dir).graphs[0].disturbed)
        steps(3000)
        backend.flush()
        size_at_6000, (memory_at_6000, _) = _dump_bytes(rank_dir), tracemalloc.get_traced_memory()
        disturbed_at_6000 = len(load_report(rank_dir).graphs[0].disturbed)
    finally:
        tracemalloc.stop()
    # Unbounded lists would have grown by 3,000 samples x 4 series (~1 MB of floats, ints and list slots).
    assert memory_at_6000 - memory_at_3000 < 100_000, (memory_at_3000, memory_at_6000)
    # The calls a loaded machine preempted are kept too, at most CallWaits.MAX_KEPT (256) of them, about 60 bytes each
    # in graph.json and summary.txt: on a busy machine that list may fill between the two flushes (about 20 KB on a
    # loaded 2-core machine). Samples kept without bound would add hundreds of KB.
    list_growth = 100 * max(0, disturbed_at_6000 - disturbed_at_3000)
    assert abs(size_at_6000 - size_at_3000) < 0.05 * size_at_3000 + list_growth, (
        size_at_3000, size_at_6000, disturbed_at_3000, disturbed_at_6000)
    graph = load_report(tmp_path).graphs[0]
    for timing in (graph.timing, graph.backward_timing, graph.splits[0].timing, graph.splits[0].backward_timing):
        assert timing.count == 6000 and not timing.complete and len(timing.samples_ms) <= 32 + 128 + 64
        assert timing.calls[0] == 1 and timing.calls[-1] == 6000
        assert sum(w.count for w in timing.windows) == 6000 and 32 <= len(timing.windows) <= 65
    assert "over the run, median per window of" in render_summary(load_report(tmp_path))


def test_periodic_flushes_write_only_what_changed(tmp_path, monkeypatch):
    """The dump appears without any flush() call; later periodic flushes neither make the traces and scripts again
    nor write them again (same inode: os.replace would give a new one), while graph.json and the manifest move on."""
    import thunderfx_debug.artifacts.dump_contents as dump_contents

    made = []
    real_scripts = dump_contents.scripts_for_graph
    monkeypatch.setattr(dump_contents, "scripts_for_graph", lambda *a, **k: made.append(1) or real_scripts(*a, **k))
    backend = ReportingBackend(dump_dir=tmp_path, repro="split", timing="split", timing_every=1, timing_warmup=0,
                               strict=True, flush_every=0.05)
    steps = _tiny_training(backend)
    manifest = tmp_path / "rank0" / "manifest.json"
    deadline = time.monotonic() + 60
    while len(backend.flush_history) < 3:
        assert time.monotonic() < deadline, backend.flush_history
        steps(20)
        time.sleep(0.01)
    assert backend.flush_history[0].kind == "periodic" and backend.flush_history[0].files_written >= 7
    script = tmp_path / "rank0" / "graph0" / "graph0_thunder_0" / "graph0_thunder_0_repro_thunder.py"
    trace = script.with_name("fwd_trace.py")
    before = {path: path.stat().st_ino for path in (script, trace, manifest)}
    flushes_before = json.loads(manifest.read_text())["flushes"]
    later = len(backend.flush_history)
    while len(backend.flush_history) < later + 2:
        assert time.monotonic() < deadline
        steps(20)
        time.sleep(0.01)
    assert made == [1]  # the scripts of graph0, made once
    assert script.stat().st_ino == before[script] and trace.stat().st_ino == before[trace]
    assert manifest.stat().st_ino != before[manifest] and json.loads(manifest.read_text())["flushes"] > flushes_before
    assert all(s.files_unchanged >= 5 for s in backend.flush_history[1:])
    assert load_report(tmp_path).meta["last_flush"]["kind"] == "periodic"


def test_a_forked_child_writes_nothing_of_its_parents_records(tmp_path):
    """A DataLoader worker forked from the training process inherits the backend (and its SIGTERM handler and atexit
    flush): it must not write its copy of the records over its parent's dump."""
    backend = ReportingBackend(dump_dir=tmp_path, timing="split", strict=True, flush_every=1e-9)
    steps = _tiny_training(backend)
    child = os.fork()
    if child == 0:  # pragma: no cover (the child): trains (a periodic flush due at every call), flushes, exits
        steps(3)
        os._exit(0 if backend.flush() is None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not (tmp_path / "rank0").exists()
    assert backend.flush() == tmp_path / "rank0"


# ---- killed and terminated training processes ---------------------------------------------------------------------
def _start(dump_dir: Path, mode: str) -> tuple[subprocess.Popen, list[str]]:
    # Nothing of an outer launcher: each child is a run of its own (run ids from the clock, host and pid).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THUNDERFX_DEBUG_", "SLURM_", "TORCHELASTIC_"))}
    child = subprocess.Popen([sys.executable, str(TESTS / "long_run.py"), str(dump_dir), mode], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.strip() for line in child.stdout), daemon=True).start()
    # stderr is read as it comes too: a pipe nobody reads blocks the child once it is full.
    child.stderr_lines = errors = []
    threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True).start()
    return child, lines


def _stderr_tail(child: subprocess.Popen) -> str:
    time.sleep(0.5)  # what the reader thread has not taken yet
    return "".join(child.stderr_lines)[-6000:]


def _wait_for(condition, child: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"the child died or hung before {what}: {_stderr_tail(child)}")
        time.sleep(0.02)


def _wait_exit(child: subprocess.Popen, what: str, timeout: float) -> int:
    """The child's exit status; where it has not ended within `timeout`, its threads' stacks (long_run.py dumps
    them on SIGUSR1) and the rest of its stderr go into the failure."""
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGUSR1)
        time.sleep(2)
        child.kill()
        raise AssertionError(f"the child did not end within {timeout:.0f} s of {what}; its stacks and stderr: "
                             f"{_stderr_tail(child)}") from None


def test_sigkill_at_a_random_moment_after_the_first_periodic_flush_leaves_a_dump_that_loads(tmp_path):
    delay = random.uniform(0.0, 1.0)  # flushes every 0.2 s: the kill may land in the middle of one
    child, lines = _start(tmp_path, "periodic")
    try:
        _wait_for(lambda: (tmp_path / "rank0" / "manifest.json").exists(), child, "its first periodic flush")
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    report = load_report(tmp_path)
    assert report.meta["flushes"] >= 1 and report.meta["config"]["flush_every"] == 0.2, f"delay {delay:.3f}"
    [graph] = report.graphs
    assert graph.calls >= 1 and graph.timing.count >= 1 and graph.splits[0].fwd_trace, f"delay {delay:.3f}"


@pytest.fixture(scope="module")
def terminated_runs(tmp_path_factory):
    """Two runs into one directory, each SIGTERMed once it trained: the first with a SIGTERM handler of its own,
    the second with none (SIGTERM's default action)."""
    dump_dir = tmp_path_factory.mktemp("restarted") / "dump"
    results = {}
    for mode in ("own-handler", "default"):
        child, lines = _start(dump_dir, mode)
        try:
            _wait_for(lambda: any(line.startswith("step 101") for line in lines), child, "training")
            child.send_signal(signal.SIGTERM)
            results[mode] = _wait_exit(child, "SIGTERM", timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        results[f"{mode} report"] = load_report(dump_dir)
    return dump_dir, results


def test_sigterm_flushes_and_then_runs_the_users_own_handler(terminated_runs):
    dump_dir, results = terminated_runs
    assert results["own-handler"] == 3  # the user's handler ended the process, as without the backend
    handler = json.loads(dump_dir.with_name("handler.json").read_text())
    assert handler["signum"] == signal.SIGTERM and handler["flushes"] == 1  # the dump was there when it ran
    first = results["own-handler report"]
    assert first.graphs[0].calls >= 101 and first.graphs[0].timing.count >= 101


def test_sigterm_without_a_handler_flushes_and_ends_as_sigterm_does(terminated_runs):
    _, results = terminated_runs
    assert results["default"] == -signal.SIGTERM
    second = results["default report"]
    assert second.meta["flushes"] >= 1 and second.graphs[0].calls >= 101


def test_a_second_run_into_the_same_directory_keeps_the_first_runs_dump(terminated_runs):
    dump_dir, results = terminated_runs
    first, second = results["own-handler report"], results["default report"]
    assert first.meta["run_id"] != second.meta["run_id"]
    kept = load_report(dump_dir / "runs" / first.meta["run_id"])
    assert kept.meta["process_uid"] == first.meta["process_uid"] and kept.graphs[0].calls == first.graphs[0].calls
    assert load_report(dump_dir).meta["run_id"] == second.meta["run_id"]
    assert [r.run_id for r in list_runs(dump_dir)] == [first.meta["run_id"], second.meta["run_id"]]
