"""The flush-time triage re-runs pieces in processes of their own: a piece whose re-run aborts its process, or hangs,
is a verdict about that piece, and neither the training process, nor its training, nor the rest of the flush (the
other pieces, the repro scripts) notices. Real Thunder runs on CPU, with executors of our own whose op is fine in
the training process and aborts (or hangs) in any other (`crashing_executors`)."""

from __future__ import annotations

import os

import pytest
import torch

import crashing_executors
from conftest import cpu_executors
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.triage import at_flush
from thunderfx_debug.triage.judging import TriageSettings
from thunderfx_debug import plain_thunder_compiler

STEPS_BEFORE, STEPS_AFTER = 3, 2


class ThreeGraphs(torch.nn.Module):
    """Three Dynamo graphs, one Thunder split each: the second calls torch.tanh, the third torch.exp."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.third = (torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        y = torch.nn.functional.gelu(self.first(x)) * 0.5
        torch._dynamo.graph_break()
        y = torch.tanh(self.second(y)) + y
        torch._dynamo.graph_break()
        return (torch.exp(self.third(y) * 0.1) * y).sum()


def _train(backend, flush_after: int | None = None, device: str = "cpu"):
    """Losses and final parameters of training `ThreeGraphs` under `backend`; with `flush_after`, `backend.flush()`
    after that many steps (its rank directory returned too)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ThreeGraphs().to(device)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(8, 16, device=device)
    losses, rank_dir = [], None
    for step in range(STEPS_BEFORE + STEPS_AFTER):
        if step == flush_after:
            rank_dir = backend.flush()
        loss = compiled(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()], rank_dir


@pytest.fixture
def in_training(monkeypatch):
    """This process is the training one: the crashing executors' ops are fine here only."""
    monkeypatch.setenv(crashing_executors.TRAINING_PID, str(os.getpid()))


def _executors(*ours):
    return [*ours, *cpu_executors()]


def _assert_as_plain(losses, params, executors, device: str = "cpu"):
    plain_losses, plain_params, _ = _train(plain_thunder_compiler(executors=executors), device=device)
    assert torch.equal(losses, plain_losses), (losses, plain_losses)
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params))


def _thunder_splits(report):
    return {f"{g.name}/{s.name}": s for g in report.graphs for s in g.splits if s.kind.value == "thunder"}


@pytest.mark.parametrize("processes", ["fork", "workers"])
def test_a_piece_whose_triage_aborts_its_process_is_its_verdict_and_training_goes_on_bit_identically(
        tmp_path, monkeypatch, one_thread, in_training, processes):
    if processes == "workers":  # as a process that initialised CUDA runs them: fresh interpreters
        monkeypatch.setattr(at_flush, "forks", lambda settings: False)
    executors = _executors(crashing_executors.aborting_ex)
    backend = ReportingBackend(dump_dir=tmp_path, triage="fusion", repro="all", flush_every=0, strict=True,
                               executors=executors)
    losses, params, rank_dir = _train(backend, flush_after=STEPS_BEFORE)
    _assert_as_plain(losses, params, executors)

    splits = _thunder_splits(load_report(rank_dir))
    aborted, others = splits.pop("graph1/thunder_0"), list(splits.values())
    # The piece that took its process down: that is its verdict, with how and where, and what its process printed.
    verdict = aborted.triage
    assert verdict.error is not None and verdict.died and verdict.thunder_ms is None
    assert "killed by signal 6 (SIGABRT) during Thunder's call of the split after inductor's first" in verdict.error
    # Its regions went on in a fresh process (the split compiled there again), and so did every other split.
    assert aborted.fusions and all(f.triage is not None and f.triage.error is None for f in aborted.fusions)
    assert others and all(s.triage is not None and s.triage.error is None and s.triage.thunder_ms > 0 for s in others)
    # Every split's scripts are written, and the dead piece's verdict tells how to rerun it.
    for split in [aborted, *others]:
        assert {"repro_thunder", "repro_inductor", "repro_eager"} <= set(split.files), split.files
        assert all((rank_dir / path).is_file() for path in split.files.values())
    triage_md = (rank_dir / "triage.md").read_text()
    assert "1 could not be judged" in triage_md and "graph1/thunder_0: the process that timed it was killed by " \
                                                       "signal 6 (SIGABRT)" in triage_md
    assert aborted.files["repro_inductor"] in triage_md


def test_a_piece_whose_triage_hangs_is_ended_at_its_time_limit_and_the_others_are_judged(
        tmp_path, monkeypatch, one_thread, in_training):
    monkeypatch.setenv("THUNDERFX_DEBUG_TRIAGE_TIMEOUT", "30")
    executors = _executors(crashing_executors.hanging_ex)
    backend = ReportingBackend(dump_dir=tmp_path, triage="split", flush_every=0, strict=True, executors=executors)
    losses, params, rank_dir = _train(backend, flush_after=STEPS_BEFORE)
    _assert_as_plain(losses, params, executors)
    splits = _thunder_splits(load_report(rank_dir))
    hung = splits.pop("graph2/thunder_0").triage
    assert hung.died and "did not finish within 30 s (THUNDERFX_DEBUG_TRIAGE_TIMEOUT)" in hung.error
    assert "_hanging_exp" in hung.error  # where it hung: the watchdog's stacks, in the process's last lines
    assert all(s.triage.error is None for s in splits.values())
    # A split whose triage died gets its scripts even with THUNDERFX_DEBUG_REPRO=none, named for why.
    assert any(p.name.startswith("graph2_thunder_0_triage_died_repro_") for p in rank_dir.rglob("*.py"))


@pytest.mark.cuda
def test_on_cuda_a_device_side_assert_in_a_piece_s_process_is_its_verdict_and_the_next_piece_gets_a_fresh_one(
        tmp_path, in_training):
    """The training process has initialised CUDA, so the children are fresh interpreters (workers); a real
    device-side assert in one leaves that child's CUDA context unusable, and only that child's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import thunder

    executors = [crashing_executors.asserting_ex, *thunder.get_default_executors()]
    backend = ReportingBackend(dump_dir=tmp_path, triage="fusion", repro="all", flush_every=0, executors=executors)
    torch.use_deterministic_algorithms(True)  # plain ThunderFX itself varies from run to run on CUDA otherwise
    try:
        losses, params, rank_dir = _train(backend, flush_after=STEPS_BEFORE, device="cuda")
        _assert_as_plain(losses, params, executors, device="cuda")
    finally:
        torch.use_deterministic_algorithms(False)
    assert not at_flush.forks(TriageSettings())  # a process that initialised CUDA runs fresh workers
    splits = _thunder_splits(load_report(rank_dir))
    asserted, others = splits.pop("graph1/thunder_0"), list(splits.values())
    assert asserted.triage.error is not None and "device-side assert" in asserted.triage.error
    assert asserted.fusions and all(f.triage.error is None for f in asserted.fusions)
    assert all(s.triage.error is None and s.triage.clock.value == "cuda" for s in others)
    assert all({"repro_thunder", "repro_inductor"} <= set(s.files) for s in [asserted, *others])


def test_a_split_compiled_ahead_of_the_flush_is_judged_without_compiling_it_again_and_training_is_unchanged(
        tmp_path, monkeypatch, one_thread, in_training):
    """Where the flush's children are fresh interpreters (a process that initialised CUDA), a child compiles a split
    with Thunder during training, on inputs made from its metadata; the flush hands it the run's tensors and it goes
    on from its compile, which nothing in training notices."""
    import json
    import shutil

    monkeypatch.setattr(at_flush, "forks", lambda settings: False)
    lines = tmp_path / "lines"
    verdicts = at_flush.verdicts

    def keeping_lines(folder, tried):  # the folders are deleted after the flush reads them
        (lines / folder.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / "results.jsonl", lines / folder.name / "results.jsonl")
        return verdicts(folder, tried)

    monkeypatch.setattr(at_flush, "verdicts", keeping_lines)
    executors = _executors()
    backend = ReportingBackend(dump_dir=tmp_path / "dump", triage="split", flush_every=0, strict=True,
                               executors=executors)
    ahead = backend._flusher._triager.ahead
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ThreeGraphs()
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(8, 16)
    losses = []

    def step():
        loss = compiled(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    for _ in range(STEPS_BEFORE):
        step()
    # the thread's next look, a fresh interpreter's start and Thunder's compile
    started = _children_ahead(ahead, 240, lambda child: "compiled ahead" in _step_lines(child.folder))
    assert started, "no split was compiled ahead within 240 s"
    # They compiled at a lower CPU priority than the training's.
    from thunderfx_debug.triage.child import AHEAD_NICENESS

    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert all(os.getpriority(os.PRIO_PROCESS, child.process.pid) >= min(19, ours + AHEAD_NICENESS)
               for child in started.values() if child.process.poll() is None)
    rank_dir = backend.flush()
    # None of the children started before the flush outlives it.
    assert not ahead.children and all(child.process.poll() is not None for child in started.values())
    for _ in range(STEPS_AFTER):
        step()
    params = [p.detach().clone() for p in model.parameters()]
    _assert_as_plain(torch.stack(losses), params, executors)

    splits = _thunder_splits(load_report(rank_dir))
    assert splits and all(s.triage.error is None for s in splits.values()), {
        k: s.triage.error for k, s in splits.items()}
    for key, child in started.items():
        steps = [json.loads(line) for line in (lines / child.folder.name / "results.jsonl").read_text().splitlines()]
        said = [s["step"] for s in steps if "step" in s]
        assert "the flush's word: the compile ahead serves" in said, said
        # The flush's child went on from the compile ahead: it did not compile the split with Thunder again.
        assert "compiling the split with Thunder and calling it once" not in said, said
        assert any(s["piece"] == key and "triage" in s for s in steps)
        assert not child.folder.exists()  # removed once read


def test_a_child_compiling_ahead_ends_and_removes_its_folder_when_the_training_process_dies(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    done = subprocess.run([sys.executable, str(Path(__file__).parent / "ahead_then_die.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    started = [line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0 and started, (done.stdout, done.stderr[-3000:])
    deadline = time.monotonic() + 180  # a child still importing torch and Thunder, or compiling, looks afterwards

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()

    def left(pid: str, folder: str) -> bool:  # the folder, and the temporary folder made for it alone
        return alive(int(pid)) or Path(folder).parent.exists()

    while time.monotonic() < deadline and any(left(pid, folder) for pid, folder in started):
        time.sleep(0.5)
    assert not [(pid, folder) for pid, folder in started if left(pid, folder)]


def test_stopping_the_compiles_ahead_ends_the_children_not_handed_to_a_flush(tmp_path, monkeypatch, one_thread):

    monkeypatch.setattr(at_flush, "forks", lambda settings: False)
    backend = ReportingBackend(dump_dir=tmp_path, triage="split", flush_every=0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        compiled(torch.randn(4, 8)).sum().backward()
    ahead = backend._flusher._triager.ahead
    children = list(_children_ahead(ahead, 60, lambda child: True).values())
    assert children, "no child started within 60 s"
    backend._flusher.stop_compiling_ahead()  # what backend.close() does after its flush
    assert all(child.process.poll() is not None for child in children)
    assert not any(child.folder.parent.exists() for child in children)
    assert not ahead.children


def _step_lines(folder) -> str:
    lines = folder / "results.jsonl"
    return lines.read_text() if lines.exists() else ""


def _children_ahead(ahead, seconds: float, ready) -> dict:
    """The children compiling ahead (split key -> child) once one of them is `ready(child)`, or after `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not any(ready(child) for child in ahead.children.values()):
        time.sleep(0.2)
    return dict(ahead.children)
