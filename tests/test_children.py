"""The child-process layer on real processes (`thunderfx_debug.children`): every runner gives an exit status by one
rule (its own, negative for a signal, None past its time limit) and says it in the same words; a long-lived child's
answers come back on a pipe of their own, whatever its scripts print; a child that is given up on is ended with
what it started, and a fork does not outlive an interrupted wait for it."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from thunderfx_debug.children import forks, pool, standalone
from thunderfx_debug.children.fork_server import ForkServer
from thunderfx_debug.children.protocol import how_it_ended

#: A script by what it does: its exit status 0, its own 3, killed by SIGABRT, past any time limit. Each first prints
#: a line that looks like an answer of the protocol, which no runner may take for one.
SCRIPTS = {
    "returns": "",
    "exits_3": "raise SystemExit(3)",
    "aborts": "import os; os.abort()",
    "hangs": "import time; time.sleep(120)",
}
FAKE_ANSWER = 'print(\'{"returncode": 0, "ready": true}\', flush=True)\n'


def _scripts(folder: Path) -> dict[str, Path]:
    paths = {}
    for name, body in SCRIPTS.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(FAKE_ANSWER + body + "\n")
    return paths


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_every_runner_gives_the_same_exit_status_for_the_same_end(tmp_path):
    scripts = _scripts(tmp_path)
    expected = {"returns": 0, "exits_3": 3, "aborts": -signal.SIGABRT, "hangs": None}
    with ForkServer() as server:
        by_server = {name: server.forked(forks.run_script, (str(path), str(tmp_path / f"{name}.server.log"), []),
                                         timeout_s=3) for name, path in scripts.items()}
        # A server that has died is an error that says so, not a wait without end.
        os.kill(server._server.pid, signal.SIGKILL)
        server._server.wait()  # gone before the request is written: writing it breaks the pipe
        with pytest.raises(RuntimeError, match="the process that runs the trials ended unexpectedly"):
            server.forked(forks.run_script, (str(scripts["returns"]), str(tmp_path / "after.log"), []), timeout_s=3)
    by_fork = {name: forks.forked(forks.run_script, (str(path), str(tmp_path / f"{name}.fork.log"), []), 3)
               for name, path in scripts.items()}
    by_process = {name: pool.run_process([sys.executable, str(path)], tmp_path / f"{name}.process.log",
                                         dict(os.environ), 3) for name, path in scripts.items()}
    by_standalone = {name: standalone.run_script(path, timeout_s=3).returncode for name, path in scripts.items()}
    assert by_server == by_fork == by_process == by_standalone == expected
    # What the scripts printed went into their logs, not into the server's answers.
    assert '"returncode": 0' in (tmp_path / "exits_3.server.log").read_text()
    assert [how_it_ended(expected[name], 3) for name in scripts] == [
        "ended with exit status 0", "ended with exit status 3", "was killed by signal 6 (SIGABRT)",
        "ran past 3 s and was ended"]


def test_a_pool_worker_answers_on_its_own_pipe_and_one_a_script_took_down_says_how(tmp_path):
    scripts = _scripts(tmp_path)
    jobs = [pool.Job(scripts[name], (), tmp_path / f"{name}.log") for name in ("returns", "exits_3", "aborts")]

    def alone(job, env, worker_end):
        return pool.Finished(job, pool.run_process([sys.executable, str(job.script)], job.log, env, 30), 0.0, "alone")

    finished = pool.run_jobs(jobs, slots=[dict(os.environ)], timeout_s=60, run_alone=alone)
    assert [(f.status, f.how) for f in finished] == [(0, "worker"), (3, "worker"), (-signal.SIGABRT, "alone")]
    assert finished[2].note.startswith("took its worker down (which was killed by signal 6 (SIGABRT)); run again alone")


def test_a_script_running_at_verifys_deadline_is_cut_and_not_judged_not_timed_out(tmp_path):
    """A deadline (a lent machine's time) kills the script it finds running: that is NOT_RUN, saying so, not a
    TIMEOUT of a script that ran for less than its own limit; one past its own limit stays a TIMEOUT."""
    from thunderfx_debug.commands import verify

    scripts = _scripts(tmp_path)
    listed = [verify.Script(f"{name}.py", scripts[name], name, "split_thunder", False) for name in ("hangs", "returns")]
    started = time.monotonic()
    cut, not_started = verify.run(listed, tmp_path, workers=1, devices=[], timeout_s=60, deadline=started + 4)
    assert time.monotonic() - started < 30
    assert (cut.outcome, cut.how) == ("NOT_RUN", "cut")
    assert re.fullmatch(r"cut at the deadline after \d+ s \(its own limit: 60 s\), with its worker", cut.note)
    assert (not_started.outcome, not_started.how, not_started.note) == ("NOT_RUN", "not_run",
                                                                        "not started before the deadline")
    timed_out, = verify.run(listed[:1], tmp_path, workers=1, devices=[], timeout_s=3, deadline=time.monotonic() + 60)
    assert (timed_out.outcome, timed_out.how, timed_out.note) == ("TIMEOUT", "timeout",
                                                                  "killed after 3 s, with its worker")


def test_a_child_past_its_limit_is_ended_with_what_it_started(tmp_path):
    """A fresh interpreter is ended with its process group: a grandchild (inductor's compile workers, a script's own
    children) does not outlive it."""
    grandchild_pid = tmp_path / "grandchild.pid"
    script = tmp_path / "starts_a_child.py"
    script.write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(grandchild_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n")
    assert pool.run_process([sys.executable, str(script)], tmp_path / "log", dict(os.environ), 5) is None
    pid = int(grandchild_pid.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


class Interrupted(Exception):
    pass


def _sleep_recording_pid(pid_file: str, log: str) -> None:
    def sleep() -> int:
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(120)
        return 0

    forks._exit_with(log, sleep)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_does_not_outlive_an_interrupted_wait_for_it(tmp_path):
    pid_file = tmp_path / "child.pid"

    def interrupt(signum, frame):
        raise Interrupted  # as Ctrl-C's KeyboardInterrupt would, in the middle of the wait

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.alarm(3)
        with pytest.raises(Interrupted):
            forks.forked(_sleep_recording_pid, (str(pid_file), str(tmp_path / "log")), timeout_s=60)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not _alive(int(pid_file.read_text()))
