"""The figures a user reads first, held against the training loop's own clock, on a real CPU run of a model whose
first frame Dynamo compiles again for a branch taken on one step: the step's wall time, what runs per step, the time
in the compiled graphs per step, what the triage says Thunder loses per step, and what the flush said it would take
against what it took. The loop times each step and its forward and backward with perf_counter, as a user would.

A rarely called variant is no step counter: the steps are the optimizer's, counted by torch's step hook, and without
an optimizer the run says that they were estimated, and from what. Where the run's own time of a piece rests on too
few samples, the triage says so and does not use it.

No bound here is a timing threshold: each figure is compared with the loop's measurement of the same thing, within a
factor that a machine shared with other work leaves room for (the faults these tests hold were 10-40x off). On CUDA
(nvFuser, marked `cuda`) the loop waits for the device after each backward and each step, as a loop that times
itself must.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch.nn import functional as F

from conftest import cpu_executors
from thunderfx_debug.commands.models import GPT, GPTConfig, synthetic_batches
from thunderfx_debug.records import FlushStage, SplitKind
from thunderfx_debug.render import accounting, digest, triage_findings
from thunderfx_debug.render.text import about_seconds

STEPS = 21
RARE_STEP = 6  # the step that takes the branch: Dynamo compiles the first frame again, and its variant runs once
#: Within this factor of the loop's own measurement (two clocks of one machine around the same work).
CLOSE = 1.5


class RarelyBranching(GPT):
    """The demo's GPT (a graph break before the head, torch.sinc sent to inductor), whose forward scales its
    embeddings when `rare` is set: a branch that Dynamo guards on, so the step that takes it runs a second variant of
    the first frame, compiled for it."""

    def forward(self, idx, targets, rare=False):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        if rare:
            x = x * 0.5
        for block in self.blocks:
            x = block(x)
        torch._dynamo.graph_break()
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _executors(device: str) -> dict:
    return {"executors": cpu_executors()} if device == "cpu" else {}  # on CUDA, Thunder's own: nvFuser


def _train(backend, optimizer: bool, device: str = "cpu"):
    """STEPS steps of the model under `backend` (AdamW, or a plain update by hand); the loop's own clock: each step's
    wall time (ms), and its forward and backward's, the steps that compiled left out."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, graph_break=True,
                       sinc_gate=True)
    model = RarelyBranching(config).to(device)
    compiled = torch.compile(model, backend=backend)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = synthetic_batches(config, batch_size=4, device=device)
    wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step_ms, forward_backward_ms = [], []
    for step in range(STEPS):
        started = time.perf_counter()
        tokens, targets = next(batches)
        compiled(tokens, targets, step == RARE_STEP).backward()
        wait()
        ran = time.perf_counter()
        if optimizer:
            adamw.step()
            adamw.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter -= 1e-3 * parameter.grad
                    parameter.grad = None
        wait()
        if step >= 2 and step != RARE_STEP:
            step_ms.append((time.perf_counter() - started) * 1e3)
            forward_backward_ms.append((ran - started) * 1e3)
    return statistics.median(step_ms), statistics.median(forward_backward_ms)


@pytest.fixture(scope="module", params=DEVICES)
def counted(request, tmp_path_factory):
    """AdamW, split timing of every tenth call (two samples of the first frame's graph: the first of them paid for a
    compile), the triage at the flush: (report, the loop's step ms, its forward and backward ms, the loop's time of
    the flush in s)."""
    from thunderfx_debug import ReportingBackend, load_report

    device = request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    try:
        backend = ReportingBackend(tmp_path_factory.mktemp("counted"), **_executors(device), timing="split",
                                   timing_every=10, timing_warmup=1, triage="split", flush_every=0, strict=True)
        step_ms, forward_backward_ms = _train(backend, optimizer=True, device=device)
        started = time.perf_counter()
        rank_dir = backend.flush()
        flush_s = time.perf_counter() - started
        return load_report(rank_dir), step_ms, forward_backward_ms, flush_s
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


@pytest.fixture(scope="module", params=DEVICES)
def estimated(request):
    """No torch optimizer, split timing of every other call: (report, the loop's step ms)."""
    from thunderfx_debug import ReportingBackend

    device = request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    try:
        backend = ReportingBackend(**_executors(device), timing="split", timing_every=2, timing_warmup=1,
                                   strict=True)
        step_ms, _ = _train(backend, optimizer=False, device=device)
        return backend.report(), step_ms
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


def test_the_run_recompiled_its_first_frame_for_one_step(counted):
    report = counted[0]
    variants = digest.recompiled_frames(report)
    assert len(variants) == 1
    first, variant = next(iter(variants.values()))
    assert (first.calls, variant.calls) == (STEPS - 1, 1)


def test_the_steps_are_the_optimizers_and_the_step_is_the_loops(counted):
    report, step_ms, forward_backward_ms, _ = counted
    steps = digest.steps(report)
    assert steps.counted and steps.count == STEPS
    account = accounting.step_account(report)
    assert account.wall_graph is None  # measured between the optimizer's steps, every step, not a graph's calls
    assert 1 / CLOSE < account.wall_ms / step_ms < CLOSE, (account.wall_ms, step_ms)
    line = next(line for line in str(report).splitlines() if line.startswith("step: "))
    assert f"between the optimizer's steps, {STEPS} optimizer steps" in line


def test_what_runs_per_step_and_the_compiled_graphs_time_per_step_are_the_loops(counted):
    """Each graph's calls per step from the counted steps (the variant's 1/21, not 1), so the time in the compiled
    graphs per step lies within the loop's forward and backward, and so does each region's time per step."""
    report, _, forward_backward_ms, _ = counted
    steps = digest.steps(report)
    per_step = {g.name: steps.per_step(g) for g in report.graphs}
    assert sorted(per_step.values()) == pytest.approx(sorted([1 / STEPS, (STEPS - 1) / STEPS, 1.0]))
    compiled = digest.compiled_ms_per_step(report)
    assert compiled < CLOSE * forward_backward_ms, (compiled, forward_backward_ms)
    for piece, _ in digest.top_regions(report):
        assert piece.ms_per_step < CLOSE * forward_backward_ms, piece.label


def test_the_time_thunder_loses_per_step_lies_within_the_loops_step(counted):
    """A triaged split's time lost per step is at most its own time per step in the run, which lies inside the
    loop's forward and backward; the variant's own time rests on too few samples, and the triage says so rather than
    use it."""
    report, _, forward_backward_ms, _ = counted
    pieces = [p for p in triage_findings.triaged_pieces(report) if p.level == "split" and p.triage.error is None]
    assert len(pieces) == sum(s.kind is SplitKind.THUNDER for g in report.graphs for s in g.splits)
    for piece in pieces:
        t = piece.triage
        assert abs(t.ms_per_step) < CLOSE * forward_backward_ms, (piece.path, t)
        if t.lost_from_the_run:
            assert abs(t.ms_per_step) <= t.run_ms * t.calls_per_step
    net = triage_findings.totals(report).net_ms
    assert abs(net) < CLOSE * forward_backward_ms
    thin = [p for p in pieces if p.triage.run_ms is not None and not p.triage.lost_from_the_run]
    assert thin and all(p.triage.run_too_thin for p in thin)
    summary = str(report)
    for piece in thin:
        assert any(piece.path in line and "too few to use" in line for line in summary.splitlines()), piece.path


def test_the_flush_says_what_it_will_take_and_then_what_it_took(counted):
    """The triage's announced estimate against what the triage took (a median over raw samples, a compile among
    them, made it 10-50x too long), and the flush's parts, which the summary lists, against the loop's clock."""
    report, _, _, flush_s = counted
    cost = report.flush_cost
    assert cost.occasion == "backend.flush()"
    assert cost.seconds <= flush_s and cost.seconds > flush_s / 2, (cost, flush_s)
    triage = next(p for p in cost.parts if p.stage is FlushStage.TRIAGE)
    assert triage.seconds == cost.triage_s
    assert 1 / 3 < triage.announced_s / triage.seconds < 3, triage
    line = next(line for line in str(report).splitlines() if line.startswith("flush (backend.flush()): "))
    assert f"triage {triage.seconds:.1f} s (announced: {about_seconds(triage.announced_s)})" in line
    assert f"The triage took {triage.seconds:.1f} s of wall time" in triage_findings.render_triage_md(report)


def test_without_an_optimizer_the_steps_are_estimated_and_said_to_be(estimated):
    """No step hook fires: the steps are the calls of the first frame, both of its variants together, and every
    figure per step says it rests on that estimate."""
    report, step_ms = estimated
    steps = digest.steps(report)
    assert not steps.counted and steps.count == STEPS and len(steps.graphs) == 2
    account = accounting.step_account(report)
    assert account.wall_graph is not None
    assert 1 / CLOSE < account.wall_ms / step_ms < CLOSE, (account.wall_ms, step_ms)
    line = next(line for line in str(report).splitlines() if line.startswith("step: "))
    assert "steps not counted (no torch.optim optimizer stepped): 21 estimated as the calls of Dynamo frame" in line


class _Optimizer:
    """What the step hook hands the counter: an optimizer, of which the counter uses nothing but its identity."""


def test_an_optimizer_made_anew_after_another_is_let_go_counts_its_own_steps(monkeypatch):
    """A training that makes a new optimizer (a restart, a learning-rate search, another phase) after letting go of
    the first: CPython gives the new one the old one's id(), which the counter keyed its steps by, so that 4 and 6
    steps read as one optimizer's 10 (the per-step figures then 0.6 of a graph call per step; seen with SGD
    optimizers in tests/test_triage.py)."""
    from thunderfx_debug.recording import steps as steps_module
    from thunderfx_debug.settings.safety import ReportingFailures

    # The second optimizer at the first's address, every time: every object has one id() in the counter's module.
    monkeypatch.setattr(steps_module, "id", lambda _: 0x7F00, raising=False)
    counter = steps_module.StepCounter(ReportingFailures(strict=True))
    counter.start()
    first = _Optimizer()
    for _ in range(4):
        counter.stepped(first)
    del first
    second = _Optimizer()
    for _ in range(6):
        counter.stepped(second)
    steps = counter.record()
    assert (steps.count, steps.optimizers) == (6, 2)
    counter.stop()
