"""The flush-time triage in every flush the README promises, on real Thunder runs on CPU: at interpreter exit in the
README's own setup (THUNDERFX_DEBUG_DIR and THUNDERFX_DEBUG_TRIAGE set, no explicit flush), the dump at SIGTERM (which
says it times nothing), the periodic flush, and an error of inductor's recorded whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import torch

import thunderfx_debug
from thunderfx_debug import load_report


#: A training script as the README sets one up: the backend, training, and nothing else. It has a SIGTERM handler of
#: its own, which the backend's chains to, and signals itself once after training: the dump at SIGTERM, then training
#: goes on and the interpreter exits.
TRAINING_SCRIPT = textwrap.dedent('''
    import os, signal
    import thunderfx_debug
    import torch
    from thunderfx_debug import ReportingBackend, load_report

    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, lambda *_: print("the script's SIGTERM handler ran", flush=True))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    compiled = torch.compile(model, backend=ReportingBackend())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    for _ in range(3):
        compiled(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    os.kill(os.getpid(), signal.SIGTERM)
    at_sigterm = load_report(os.path.join(os.environ["THUNDERFX_DEBUG_DIR"], "rank0"))
    print("AT SIGTERM |", [s.triage.error.splitlines()[0] for g in at_sigterm.graphs for s in g.splits if s.triage])
''')


def test_the_dump_at_exit_of_a_training_script_holds_verdicts_and_sigterm_s_says_why_not(tmp_path):
    """The flush at exit times the splits while inductor can still compile (threading's exit hook, before
    concurrent.futures stops taking work: "cannot schedule new futures after interpreter shutdown" otherwise), says
    so once on stderr though the script set up no logging, and the dump at SIGTERM says it timed nothing."""
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT)
    # A cold inductor cache, as on a fresh machine: a compile that hits the cache schedules no work at all.
    environment = {**os.environ, "THUNDERFX_DEBUG_DIR": str(tmp_path / "dump"), "THUNDERFX_DEBUG_TRIAGE": "split",
                   "THUNDERFX_DEBUG_FLUSH_EVERY": "0", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor_cache")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env=environment, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the script's SIGTERM handler ran" in done.stdout
    at_sigterm = next(line for line in done.stdout.splitlines() if line.startswith("AT SIGTERM |"))
    assert "not triaged: the dump at SIGTERM times nothing" in at_sigterm
    announcements = [line for line in done.stderr.splitlines() if "against inductor in processes of their own" in line]
    assert len(announcements) == 1, done.stderr[-3000:]
    assert "the flush at exit times 1 Thunder split" in announcements[0]
    # What it costs is said when the backend is made, before training: not first at its end.
    said_first = done.stderr.index("THUNDERFX_DEBUG_TRIAGE=split: the first flush that triages")
    assert said_first < done.stderr.index(announcements[0])
    # The estimate in words (render/text.about_seconds): a fast machine times one small split in under a second.
    assert re.search(r", (about \d+ s|under a second) \(from the run's first calls", announcements[0]), announcements[0]
    report = load_report(tmp_path / "dump" / "rank0")
    triages = [s.triage for g in report.graphs for s in g.splits if s.kind.value == "thunder"]
    assert triages and all(t is not None and t.error is None and t.ratio is not None for t in triages), [
        t and t.error for t in triages]


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.second(torch.nn.functional.gelu(self.first(x))).sum()


def _train(backend, steps: int, pause_s: float = 0.0) -> None:
    """`steps` steps, with a pause of `pause_s` before the last one."""
    torch.manual_seed(0)
    model = Small()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 32)
    for step in range(steps):
        if step == steps - 1:
            time.sleep(pause_s)
        compiled(x).backward()


def test_the_periodic_flush_times_the_pieces_once(tmp_path, one_thread):
    backend = thunderfx_debug.ReportingBackend(tmp_path, triage="split", flush_every=1.0, timing="off", strict=True)
    _train(backend, steps=2, pause_s=1.0)  # the flush is due by the last step's graph call, whatever compiling took
    assert backend.wait_for_flush(timeout=120)
    periodic = [f for f in backend.flush_history if f.kind == "periodic"]
    assert periodic
    triages = [s.triage for g in load_report(tmp_path / "rank0").graphs for s in g.splits if s.kind.value == "thunder"]
    assert triages and all(t is not None and t.error is None for t in triages)
    found = [s.triage for g in backend.report().graphs for s in g.splits]
    backend.flush()  # times nothing again: the same records
    assert [s.triage for g in backend.report().graphs for s in g.splits] == found


def test_an_inductor_failure_is_recorded_whole(tmp_path, monkeypatch):
    backend = thunderfx_debug.ReportingBackend(tmp_path, triage="split", flush_every=0, timing="off")
    _train(backend, steps=1)
    detail = "a message longer than anything cut at 400 characters, " * 20 + "and its last words"

    def failing_compile(gm, example_inputs):
        raise RuntimeError(detail)

    monkeypatch.setattr(torch._inductor, "compile", failing_compile)
    rank_dir = backend.flush()
    error = next(s.triage.error for g in load_report(rank_dir).graphs for s in g.splits if s.kind.value == "thunder")
    assert error.startswith("inductor could not compile the split: RuntimeError: a message longer")
    assert detail in error and "failing_compile" in error  # the message and its traceback, whole
    triage_md = (rank_dir / "triage.md").read_text()
    assert "and its last words" in triage_md and "## Not judged" in triage_md
    summary = (rank_dir / "summary.txt").read_text()
    assert "1 not judged" in summary and "not judged: graph0/thunder_0: inductor could not compile the split" in summary
