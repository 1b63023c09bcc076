"""The correctness sentinel (THUNDERFX_DEBUG_CHECK) on real Thunder runs on CPU: a Thunder executor of our own that
computes one op wrongly gets its split (and only it) flagged, with a mismatch script that exits 1; dropout raises no
false alarm; the training is bit-identical with the check on and off; a failing check is logged once, not raised.
Then the records, the rendering and the diff of its findings, without Thunder."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import ThreeSplits, cpu_executors, dump_fixtures, sitecustomize_source, tiny_gpt, train
from wrong_executors import slightly_wrong_sin_executor, wrong_cos_executor, wrong_sin_executor
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.records import Check, DumpError, SplitKind, SplitRecord
from thunderfx_debug.render.report import Report
from thunderfx_debug.render import correctness
from thunderfx_debug.render.diff import diff_reports, render_diff
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_summary
from thunderfx_debug.render.text import plural


def _train(model, backend, steps: int, make_input=lambda: torch.randn(4, 8)):
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        out = compiled(make_input())
        loss = sum(out) if isinstance(out, tuple) else out
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def _splits(report) -> dict[str, SplitRecord]:
    return {f"{g.name}/{s.name}": s for g in report.graphs for s in g.splits}


def test_a_wrong_executor_flags_its_split_and_no_other_and_its_script_exits_1(tmp_path):
    import thunder

    torch.manual_seed(0)
    # Thunder's default executors (no fusion regions on CPU: the regions' check is tested below), so that the
    # script's rerun compiles nothing
    backend = ReportingBackend(dump_dir=tmp_path, check="split", check_every=2, strict=True,
                               executors=[wrong_sin_executor(), *thunder.get_default_executors()])
    _train(ThreeSplits(), backend, steps=3)
    splits = _splits(backend.report())
    assert splits["graph0/inductor_1"].check is None  # inductor's, not Thunder's: not checked
    clean, wrong = splits["graph0/thunder_0"].check, splits["graph0/thunder_2"].check
    assert (clean.calls, clean.mismatches) == (2, 0) and clean.compared > 0  # calls 1 and 3
    assert (wrong.calls, wrong.mismatches, wrong.first_mismatch_call) == (2, 2, 1)
    assert wrong.worst_output == "forward output 0" and wrong.worst_ratio > 100
    assert wrong.reference == "float64 eager" and wrong.rtol == 1e-4
    assert wrong.mismatched_values == ("forward output 0",)  # its gradients are right: Thunder's cos is

    rank_dir = backend.flush()
    report = load_report(rank_dir)
    scripts = [(f"{g.name}/{s.name}", label, path) for g in report.graphs for s in g.splits
               for label, path in s.files.items() if "mismatch" in path]
    assert sorted((piece, label) for piece, label, _ in scripts) == [("graph0/thunder_2", "mismatch_inputs"),
                                                                     ("graph0/thunder_2", "repro_mismatch_thunder")]
    script = rank_dir / next(path for _, label, path in scripts if label == "repro_mismatch_thunder")
    assert _run_mismatch_script(script, tmp_path) == (
        "RESULT MISMATCH (exit 1): in the run: beyond the tolerance; outside the run, with thunder: reproduces; "
        "a finding about Thunder, worth reporting upstream with this script")


def test_a_small_check_share_passes_scheduled_calls_over_counts_them_and_leaves_the_training_as_it_was():
    def run(share):
        torch.manual_seed(0)
        backend = ReportingBackend(check="split", check_every=1, check_share=share, strict=True,
                                   executors=[wrong_sin_executor(), *cpu_executors()])
        torch.manual_seed(1)
        losses = _train(ThreeSplits(), backend, steps=6)
        return losses, backend.report()

    every_losses, every_report = run(100)
    rare_losses, rare_report = run(0.001)
    every, rare = _splits(every_report), _splits(rare_report)  # a split's turn comes round every few hours of training
    assert torch.equal(torch.stack(every_losses), torch.stack(rare_losses))
    for name in ("graph0/thunder_0", "graph0/thunder_2"):
        assert (every[name].check.calls, every[name].check.passed_over) == (6, 0)
        # The first call checks every split, as CHECK_EVERY promises; the scheduled calls after it are passed over.
        assert (rare[name].check.calls, rare[name].check.passed_over) == (1, 5)
    wrong = rare["graph0/thunder_2"].check
    assert (wrong.mismatches, wrong.first_mismatch_call) == (1, 1)
    assert "(5 more scheduled, passed over to keep the checks within THUNDERFX_DEBUG_CHECK_SHARE" in \
        correctness.describe_check(wrong)
    assert "; 10 scheduled checks of a split passed over, to keep the checks within THUNDERFX_DEBUG_CHECK_SHARE" \
        in render_summary(rare_report)


def test_what_a_checked_step_costs_beyond_the_checks_own_work_is_charged_to_the_splits_that_took_it():
    import time

    # Each step lasts 100 ms or more (a sleep after it): a check's own work (a few ms) is small beside that. At a
    # 50 % share both splits take call 4 (half of 300 ms of training since call 1 covers their first checks).
    # Where step 4 then takes 1.5 s longer outside the checks' own work (a stall the step pays for its checks),
    # that is charged to them: their credit after it is about -1.5 s + 0.5 x 1.8 s, and call 7 is passed over;
    # where it does not, call 7 is checked.
    def run(stall_s):
        torch.manual_seed(0)
        backend = ReportingBackend(check="split", check_every=3, check_share=50, timing="off", strict=True,
                                   executors=[*cpu_executors()])
        model = ThreeSplits()
        compiled = torch.compile(model, backend=backend)
        for step in range(1, 8):
            compiled(torch.randn(4, 8)).backward()
            time.sleep(0.1 + (stall_s if step == 4 else 0.0))
        return {name: (s.check.calls, s.check.passed_over) for name, s in _splits(backend.report()).items()
                if s.check is not None}

    assert run(0.0) == {"graph0/thunder_0": (3, 0), "graph0/thunder_2": (3, 0)}
    assert run(1.5) == {"graph0/thunder_0": (2, 1), "graph0/thunder_2": (2, 1)}


def test_a_split_no_longer_asked_stops_slowing_the_turns_of_the_others():
    from thunderfx_debug.recording.turns import Turns

    now = [0]  # seconds
    turns = Turns(1.0, counter=lambda: now[0] * 10**9)
    live, gone = turns.join(), turns.join()  # `gone`: a graph compiled again, never called after its first call

    def scheduled(turn, at, call):
        now[0] = at
        taken = turn.take(call)
        if taken:
            with turn.spending():
                now[0] += 1  # each check costs 1 s
        return taken

    assert scheduled(live, 0, 1) and scheduled(gone, 1, 1)
    # While `gone` counts, `live` earns half of the 1 % share; its first turn, spread to half the period, after 100 s.
    assert [scheduled(live, at, call) for at, call in ((99, 51), (103, 101))] == [False, True]
    # Ten minutes after `gone` was last asked it no longer counts: `live` earns the whole share, 1 s of credit in
    # 100 s (with `gone` still counted: in 200 s).
    assert [scheduled(live, at, call) for at, call in ((700, 151), (760, 201), (801, 251))] == [True, False, True]
    assert (live.passed_over, gone.passed_over) == (2, 0)


def test_a_mismatching_region_gets_a_script_that_runs_the_region_again(tmp_path, monkeypatch):
    """Real fusion regions check clean; a region flagged against a reference that is wrong (here on purpose): its
    script holds the region's inputs and outputs of that call, finds the run's outputs right against the true
    reference, and exits 1 saying that the mismatch does not reproduce."""
    torch.manual_seed(0)
    backend = ReportingBackend(dump_dir=tmp_path, check="fusion", check_every=1, strict=True, executors=cpu_executors())
    compiled = torch.compile(ThreeSplits(), backend=backend)
    compiled(torch.randn(4, 8)).backward()
    regions = [f.check for s in backend.report().graphs[0].splits for f in s.fusions]
    assert len(regions) == 4 and all(c.calls == 1 and c.mismatches == 0 and c.compared for c in regions)
    references = backend.recorder.graphs[0].split_gm.thunder_2.check.regions.references
    real_get = references.get

    def off_by_one(key):
        reference = real_get(key)
        return dataclasses.replace(reference, fn=lambda *a: [x + 1 for x in reference.fn(*a)])

    monkeypatch.setattr(references, "get", off_by_one)
    compiled(torch.randn(4, 8)).backward()
    monkeypatch.undo()
    graph = backend.report().graphs[0]
    region = next(f for f in graph.split("thunder_2").fusions if f.phase.value == "forward")
    assert (region.check.mismatches, region.check.first_mismatch_call) == (1, 2)
    assert all(f.check.mismatches == 0 for f in graph.split("thunder_0").fusions)  # another split's references
    assert [s.check.mismatches for s in graph.splits if s.check] == [0, 0]  # the splits against eager: right
    split = load_report(backend.flush()).graphs[0].split("thunder_2")
    files = next(f for f in split.fusions if f.name == region.name and f.phase is region.phase).files
    assert files["repro_mismatch_inductor"].endswith(f"graph0_thunder_2_{region.name}_forward_repro_mismatch_inductor.py")
    assert _run_mismatch_script(tmp_path / "rank0" / files["repro_mismatch_inductor"], tmp_path) == (
        "RESULT MISMATCH (exit 1): in the run: within the tolerance here; outside the run, with inductor: does not "
        "reproduce; seen in the run only, so report it with the run's dump, not this script alone")


def _run_mismatch_script(script: Path, tmp_path: Path) -> str:
    """Runs a mismatch script where the test's wrong executors are registered too (as a user's own executor would
    be, by the code that defines it), so that it can rerun the piece with the run's executors; its RESULT line."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(sitecustomize_source(
        "import thunderfx_debug\nimport wrong_executors\nwrong_executors.wrong_sin_executor()\n"
        "wrong_executors.wrong_cos_executor()\nwrong_executors.slightly_wrong_sin_executor()\n"))
    path = os.pathsep.join([str(site), str(Path(__file__).parent)])
    done = subprocess.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("RESULT")][-1]


def test_a_verdict_and_its_own_script_agree_on_a_small_error_in_bf16(tmp_path):
    """bf16 values ~1e-3 computed 30% off: the sentinel's MISMATCH and its script's judgement of what the run
    produced are one judgement (with a floor of atol = 0.05 the script used to find them within the tolerance)."""
    import thunder

    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 16) / 4)

        def forward(self, x):
            return torch.sin(x @ self.w * 1e-3)

    torch.manual_seed(0)
    backend = ReportingBackend(dump_dir=tmp_path, check="split", check_every=1, strict=True,
                               executors=[slightly_wrong_sin_executor(), *thunder.get_default_executors()])
    model = Small().to(torch.bfloat16)
    torch.compile(model, backend=backend)(torch.randn(8, 16, dtype=torch.bfloat16)).sum().backward()
    check = backend.report().graphs[0].splits[0].check
    assert check.mismatches == 1 and "forward output 0" in check.mismatched_values
    assert 1 < check.worst_ratio < 10 and check.worst_abs_error < 0.05  # small: an atol of 0.05 would pass it
    split = load_report(backend.flush()).graphs[0].splits[0]
    script = tmp_path / "rank0" / split.files["repro_mismatch_thunder"]
    assert _run_mismatch_script(script, tmp_path).startswith(
        "RESULT MISMATCH (exit 1): in the run: beyond the tolerance; outside the run, with thunder: reproduces")


def test_wrong_gradients_are_flagged_and_their_script_exits_1(tmp_path):
    import thunder

    torch.manual_seed(0)
    # Thunder's default executors: a split check needs no fusion region, and its script then compiles nothing
    backend = ReportingBackend(dump_dir=tmp_path, check="split", check_every=1, strict=True,
                               executors=[wrong_cos_executor(), *thunder.get_default_executors()])

    class Sine(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8) / 3)

        def forward(self, x):
            return torch.sin(x @ self.w).sum()

    _train(Sine(), backend, steps=2)
    check = backend.report().graphs[0].splits[0].check
    assert check.mismatches == 2 and check.worst_output.startswith("gradient of input")
    assert check.mismatched_values == ("gradient of input 1 (l_self_parameters_w_)",)  # the forward is right
    split = load_report(backend.flush()).graphs[0].splits[0]
    script = backend.flush() / split.files["repro_mismatch_thunder"]
    assert _run_mismatch_script(script, tmp_path) == (
        "RESULT MISMATCH (exit 1): in the run: beyond the tolerance; outside the run, with thunder: reproduces; "
        "a finding about Thunder, worth reporting upstream with this script")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x):
        return torch.sin(x @ self.w) + x


def test_every_checked_call_of_a_graph_called_several_times_per_step_gets_its_backward_checked():
    """One graph, three calls per step (per-layer graphs, FSDP blocks): each call's backward is checked, with a wrong
    cos making every one of them mismatch."""
    import thunder

    torch.manual_seed(0)
    backend = ReportingBackend(check="split", check_every=1, strict=True,
                               executors=[wrong_cos_executor(), *thunder.get_default_executors()])
    blocks = [torch.compile(Block(), backend=backend) for _ in range(3)]
    x = torch.randn(4, 8, requires_grad=True)
    for block in blocks:
        x = block(x)
    x.sum().backward()
    assert len(backend.report().graphs) == 1
    check = backend.report().graphs[0].splits[0].check
    assert (check.calls, check.mismatches, check.verified_gradients) == (3, 3, 6)  # w and x, each call
    assert not check.skipped


def test_a_capture_that_cannot_be_verified_is_never_called_a_mismatch(monkeypatch):
    """What the hooks saw of the split's gradients is proved against what autograd delivered to each input. A
    capture gone wrong (here: zeros, as keying nodes by the ids of dropped Python wrappers gave on torch < 2.12)
    is reported as not compared, with the reason, and never as a MISMATCH; gradients whose capture is right stay
    compared."""
    from thunderfx_debug.recording import split_check

    real_total = split_check._total
    monkeypatch.setattr(split_check, "_total", lambda grads, before: torch.zeros_like(real_total(grads, before)))
    torch.manual_seed(0)
    backend = ReportingBackend(check="split", check_every=1, strict=True, executors=cpu_executors())
    _train(ThreeSplits(), backend, steps=2)
    checks = [s.check for s in backend.report().graphs[0].splits if s.check is not None]
    assert checks and all(c.mismatches == 0 and c.verified_gradients == 0 and c.compared for c in checks)
    assert all(any("cannot be verified: autograd's total for it is not what this split passed on" in r
                   for r in c.skipped) for c in checks)
    monkeypatch.undo()
    torch._dynamo.reset()
    backend = ReportingBackend(check="split", check_every=1, strict=True, executors=cpu_executors())
    _train(ThreeSplits(), backend, steps=2)
    checks = [s.check for s in backend.report().graphs[0].splits if s.check is not None]
    assert all(c.verified_gradients > 0 and not c.skipped for c in checks)


_NODE_WRAPPERS_DROPPED = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 12)


@pytest.mark.skipif(not _NODE_WRAPPERS_DROPPED, reason="torch >= 2.12 keeps a node's Python wrapper alive with "
                                                        "the node (pytorch/pytorch#181390)")
def test_gradients_reach_their_own_inputs_where_torch_drops_node_wrappers():
    """On torch < 2.12 (the H200's 2.11) the `id()` of an autograd node's dropped Python wrapper is reused by the
    next one: keyed by such ids, GPT-2's tied embedding and every LayerNorm weight got no gradient or another
    input's, and were MISMATCH with relative error 1."""
    import harness_path  # noqa: F401  (benchmarks/ on sys.path)
    import harness

    torch.manual_seed(0)
    model, batch = harness.build("gpt2", "tiny")
    backend = ReportingBackend(check="split", check_every=1, strict=True, **harness.thunder_options("cpu"))
    harness.train(model, batch, backend, steps=2)
    checks = [s.check for g in backend.report().graphs for s in g.splits if s.check is not None]
    assert checks and all(c.mismatches == 0 for c in checks)
    assert sum(c.verified_gradients for c in checks) > 0


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gpt2", "qwen3"])
def test_the_zoo_checks_clean_with_nvfuser_and_its_training_is_unchanged(name):
    """The H200's false gradient MISMATCHes (every norm weight of GPT-2, every parameter of Qwen3's decoder split),
    on CUDA with Thunder's default executors: no mismatch, captures verified, losses and parameters as unchecked."""
    import harness_path  # noqa: F401
    import harness

    def run(**options):
        torch._dynamo.reset()
        model, batch = harness.build(name, "tiny", "cuda", "bfloat16")
        backend = ReportingBackend(strict=True, **options)
        losses = torch.stack(harness.train(model, batch, backend, steps=3))
        return losses, [p.detach().clone() for p in model.parameters()], backend

    plain_losses, plain_params, _ = run()
    losses, params, backend = run(check="fusion", check_every=1)
    assert torch.equal(plain_losses, losses) and all(torch.equal(a, b) for a, b in zip(plain_params, params))
    checks = [s.check for g in backend.report().graphs for s in g.splits if s.check is not None]
    assert checks and all(c.mismatches == 0 and not c.failures for c in checks)
    assert sum(c.verified_gradients for c in checks) > 0


@pytest.mark.cuda
def test_what_a_check_allocates_on_cuda_lies_in_its_own_pool_whichever_thread_allocates():
    """The eager backward of a check runs its nodes on autograd's device thread: those allocations go to the check's
    pool too, and none of the run's."""
    from thunderfx_debug.recording.isolation import CheckIsolation

    def pool_of(t):
        for segment in torch.cuda.memory._snapshot()["segments"]:
            if segment["address"] <= t.data_ptr() < segment["address"] + segment["total_size"]:
                return tuple(segment.get("segment_pool_id", (0, 0)))
        return None

    isolation = CheckIsolation()
    x = torch.randn(512, 512, device="cuda", requires_grad=True)
    with isolation.entered([x]):
        doubled = x.detach() * 2
        leaf = x.detach().requires_grad_()
        (grad,) = torch.autograd.grad((leaf.sin() * 3).sum(), [leaf])
        pools = {pool_of(doubled), pool_of(grad)}
        own = pool_of(x)
    assert len(pools) == 1 and own not in pools and own == (0, 0), (pools, own)
    after = x * 2  # the training's allocations stay in the default pool
    assert pool_of(after) == (0, 0)


def test_a_checked_call_whose_backward_never_runs_frees_its_graph():
    """The hooks of a gradient check hold no autograd node: an evaluation step with grad enabled leaks nothing."""
    import gc
    import weakref

    backend = ReportingBackend(check="split", check_every=1, strict=True, executors=cpu_executors())
    compiled = torch.compile(ThreeSplits(), backend=backend)
    compiled(torch.randn(4, 8, requires_grad=True)).backward()
    x = torch.randn(4, 8, requires_grad=True)
    seen = weakref.ref(x)
    out = compiled(x)  # checked; its backward never runs
    has_graph = out.grad_fn is not None
    del x, out
    gc.collect()
    assert has_graph and seen() is None
    check = backend.report().graphs[0].splits[0].check
    assert check.calls == 2
    assert any("the backward of checked call 2 never ran" in reason for reason in check.skipped)


class Dropped(nn.Module):
    """A loss through dropout, and one beside it that no random op touches."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Parameter(torch.randn(16, 16) / 4) for _ in range(3))

    def forward(self, x):
        noisy = (F.dropout(torch.tanh(x @ self.w1), 0.5, training=True) @ self.w2).square().mean()
        steady = torch.tanh(x @ self.w3).square().mean()
        return noisy, steady


@pytest.fixture(scope="module")
def dropped() -> Report:
    """`Dropped` trained 3 steps on CPU with every call checked at `fusion`."""
    torch.manual_seed(0)
    backend = ReportingBackend(check="fusion", check_every=1, strict=True, executors=cpu_executors())
    _train(Dropped(), backend, steps=3, make_input=lambda: torch.randn(8, 16))
    return backend.report()


def test_dropout_raises_no_false_alarm(dropped):
    split = dropped.graphs[0].splits[0]
    assert split.check.mismatches == 0 and split.check.calls == 3
    assert split.check.compared >= 3 * 2  # the steady output and the gradient of w3, every call
    assert any("forward outputs [0] depend on random ops (dropout)" in r for r in split.check.skipped)
    assert any("gradients of 2 inputs depend on random ops" in r for r in split.check.skipped)
    regions = [f.check for f in split.fusions]
    assert all(c is not None and c.mismatches == 0 for c in regions)
    assert any(any("draws random numbers" in r for r in c.skipped) for c in regions)
    assert all(c.compared > 0 for c in regions)  # even the random region: its outputs still held


def _counted(paths) -> str:
    splits = sum(path.count("/") == 1 for path in paths)
    return f"{plural(splits, 'split')}, {plural(len(paths) - splits, 'fusion region')}"


def test_pieces_with_values_left_uncompared_are_counted_apart_from_the_checked_clean(dropped):
    """Dropout's values are not compared (Thunder and eager draw differently): the split and the region that draws
    are partly compared, and the summary and the page count them apart from the pieces whose every value was
    compared, never among the checked clean."""
    pieces = {p.path: p for p in correctness.checked_pieces(dropped)}
    assert all(p.check is not None and p.check.compared > 0 and not p.check.mismatched for p in pieces.values())
    partly = {path for path, p in pieces.items() if p.check.skipped}
    whole = set(pieces) - partly
    assert partly and whole, "the run no longer has both kinds of piece this test is about"
    assert {path for path, p in pieces.items() if p.status == "partly compared"} == partly
    assert {path for path, p in pieces.items() if p.status == "clean"} == whole
    assert all(pieces[path].check.partly_compared and not pieces[path].check.clean for path in partly)
    summary = render_summary(dropped)
    assert f"no mismatch in {len(pieces)} compared pieces, {len(partly)} of them only partly compared" in summary
    assert f"checked clean: {_counted(whole)}; partly compared: {_counted(partly)}" in summary
    page = render_html({0: dropped}, {0: "rank0/"})
    verdicts = re.findall(r'<tr><td><span class="[a-z]+">(ok|partly compared)</span></td><td>([^<]+)</td>', page)
    assert sorted(verdicts) == sorted([("ok", path) for path in whole] + [("partly compared", path) for path in partly])


def test_training_is_bit_identical_with_the_check_on_and_off(one_thread):
    def run(**options):
        torch._dynamo.reset()
        model, config = tiny_gpt(seed=0)
        backend = ReportingBackend(executors=cpu_executors(), strict=True, **options)
        losses = train(torch.compile(model, backend=backend), model, config, steps=6)
        return losses, [p.detach().clone() for p in model.parameters()], backend

    torch.manual_seed(1)
    plain_losses, plain_params, _ = run()
    torch.manual_seed(1)
    losses, params, backend = run(check="fusion", check_every=2, timing="fusion", timing_every=2, timing_warmup=0)
    assert torch.equal(plain_losses, losses)
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    report = backend.report()
    checks = [s.check for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    assert checks and all(c.calls == 3 and c.mismatches == 0 for c in checks)  # calls 1, 3, 5
    # timing samples move off the checked calls: 2, 4, 6 instead of 1, 3, 5
    assert report.graphs[0].timing.calls == (2, 4, 6)


def test_the_random_stream_is_left_as_it_was():
    """The checks run dropout too (in eager and float64): the random numbers after a checked step are those of an
    unchecked one."""
    def after(**options):
        torch._dynamo.reset()
        torch.manual_seed(0)
        backend = ReportingBackend(executors=cpu_executors(), strict=True, **options)
        _train(Dropped(), backend, steps=1, make_input=lambda: torch.ones(8, 16))
        return torch.rand(4)

    assert torch.equal(after(), after(check="split"))


def test_a_failing_check_is_logged_once_and_never_raised(caplog):
    torch.manual_seed(0)
    backend = ReportingBackend(check="split", check_every=1, executors=cpu_executors())
    compiled = torch.compile(ThreeSplits(), backend=backend)
    compiled(torch.randn(4, 8)).backward()  # compiles; the first call is checked
    runner = backend.recorder.graphs[0].split_gm.thunder_2

    def broken(*args):
        raise RuntimeError("the reference is broken")

    runner.check.module = broken
    with caplog.at_level("WARNING", logger="thunderfx_debug"):
        for _ in range(3):
            loss = compiled(torch.randn(4, 8))
            loss.backward()
    assert torch.isfinite(loss)
    failures = backend.recorder.failures
    assert sum(n for (what, _), n in failures.counts.items() if what == "checking the forward") == 3
    assert sum("the reference is broken" in r.getMessage() for r in caplog.records) == 1
    check = backend.report().graphs[0].split("thunder_2").check
    assert check.failures == 3 and not check.clean and check.compared > 0  # its gradients were still compared
    assert check.failed == ("checking the forward raised RuntimeError: the reference is broken",)
    summary = render_summary(backend.report())
    assert "1 of 2 pieces not compared (1 the check failed)" in summary
    assert "  check failed: graph0/thunder_2: checking the forward raised RuntimeError: the reference is broken" in summary
    assert "checked clean: 1 split, 0 fusion regions" in summary
    backend.config = dataclasses.replace(backend.config, strict=True)
    failures.strict = True
    with pytest.raises(RuntimeError, match="the reference is broken"):
        compiled(torch.randn(4, 8))


# ---- the fusion-level observer: a value written after its region returned ----------------------------------------

def test_a_write_behind_the_programs_back_is_a_mismatch_and_its_region_is_found_next():
    """A region's output written after the region returned (no version counter bumped, as by a stray kernel write)
    is a mismatch of the tensor hit; on the next checked call, the region during which it happens is named."""
    from thunderfx_debug.recording.check import CheckTally, EvidenceKeeper
    from thunderfx_debug.recording.region_check import RegionCheck
    from thunderfx_debug.settings.safety import ReportingFailures
    from thunderfx_debug.thunder.reference import RegionReference

    class References:
        def get(self, key):
            return RegionReference(key, lambda a: [a * 2, a + 1], (), (), ("t0", "t1"))

    failures = ReportingFailures(strict=True)
    tallies: dict[str, CheckTally] = {}
    split = CheckTally()
    observer = RegionCheck("graph0/thunder_0", References(), tallies, failures, EvidenceKeeper(1.0, failures), split)

    def call(number, x, stray_write):
        observer.watch_inputs([("input 0 (x)", x)], written=set())
        observer.forward_call = number
        observer.begin_trace("forward")
        observer.begin_region("nvFusion0_forward", x)
        first = (x * 2, x + 1)
        observer.end_region("nvFusion0_forward", *first)
        observer.begin_region("nvFusion1_forward", first[0])
        stray_write(x, first)  # while nvFusion1 runs
        observer.end_region("nvFusion1_forward", first[0] * 2, first[0] + 1)
        observer.end_trace("forward")
        observer.forward_call = 0
        return first

    def hit_output(x, first):
        first[1].data[2] = 100.0

    kept = call(7, torch.arange(4.0), hit_output)
    victim = tallies["nvFusion0_forward"].record()
    assert (victim.calls, victim.mismatches, victim.first_mismatch_call) == (1, 1, 7)
    assert victim.worst_output.startswith("output 1 (t1) of nvFusion0_forward changed after it was returned, before "
                                          "the end of the split's forward")
    assert victim.worst_abs_error == 97.0 and math.isinf(victim.worst_ratio)
    assert tallies["nvFusion1_forward"].record().mismatches == 0
    assert kept[1][2] == 100.0

    def hit_output_and_input(x, first):
        first[1].data[0] = -1.0
        x.data[3] = 50.0

    call(8, torch.arange(4.0), hit_output_and_input)  # localising: compared after every region
    culprit = tallies["nvFusion1_forward"].record()
    assert (culprit.mismatches, culprit.first_mismatch_call) == (1, 8)
    found = culprit.mismatched_values
    assert "output 1 (t1) of nvFusion0_forward changed while nvFusion1_forward ran (it is not an output of " \
           "nvFusion1_forward)" in found
    assert "the split's input 0 (x) changed while nvFusion1_forward ran (it is not an output of " \
           "nvFusion1_forward)" in found
    assert tallies["nvFusion0_forward"].record().mismatches == 1  # call 7 only: on call 8 the writer was named
    assert culprit.writes_unowned_memory and not tallies["nvFusion0_forward"].record().writes_unowned_memory
    assert victim.overwritten and tallies["nvFusion0_forward"].record().overwritten
    # an update through PyTorch (version bumped) is the program's own, and an unarmed trace checks nothing
    calls = split.calls
    call(9, torch.arange(4.0), lambda x, first: first[1].add_(1))
    observer.begin_trace("forward")
    observer.end_trace("forward")
    assert tallies["nvFusion0_forward"].record().mismatches == 1 and split.calls == calls


# ---- records, rendering, diff -------------------------------------------------------------------------------------

MISMATCH = Check(calls=3, mismatches=2, compared=30, first_mismatch_call=51, worst_output="forward output 2",
                 worst_call=51, worst_abs_error=0.31, worst_rel_error=0.05, worst_ratio=24.8, rtol=0.05, atol=0.05,
                 allowed=0.0125, reference="float64 eager", skipped=("forward outputs [1] depend on random ops",))
CHANGED = Check(calls=1, mismatches=1, compared=4, first_mismatch_call=1, worst_output="output 3 (t9): changed",
                worst_call=1, worst_abs_error=2.0, worst_rel_error=math.inf, worst_ratio=math.inf, rtol=0.0,
                atol=0.0, allowed=0.0, reference="its own value right after the region returned")


def test_check_records_round_trip_and_refuse_damage():
    for check in (MISMATCH, CHANGED, Check(calls=2)):
        assert Check.from_json(check.to_json(), "check") == check
    assert CHANGED.to_json()["worst_ratio"] == "inf"  # JSON has no infinity
    with pytest.raises(DumpError, match=r"graph.json.splits\[0\].check.mismatches: expected int"):
        Check.from_json({**MISMATCH.to_json(), "mismatches": "two"}, "graph.json.splits[0].check")
    with pytest.raises(DumpError, match="expected a count >= 0"):
        Check.from_json({"calls": -1}, "check")


def test_dumps_without_checks_load_with_none():
    report = load_report(dump_fixtures() / "normal")
    assert all(s.check is None and all(f.check is None for f in s.fusions) for g in report.graphs for s in g.splits)


def _report_with(check: Check | None) -> Report:
    report = load_report(dump_fixtures() / "normal")
    graph = report.graphs[0]
    split = next(s for s in graph.splits if s.kind is SplitKind.THUNDER)
    # As the builder lists them: the inputs file the mismatch scripts load, then the scripts.
    files = {**split.files, "mismatch_inputs": "graph0/graph0_thunder_0/inputs/graph0_thunder_0_mismatch_inputs.pt",
             "repro_mismatch_thunder": "graph0/graph0_thunder_0/graph0_thunder_0_mismatch_thunder.py"}
    changed = dataclasses.replace(split, check=check, files=files if check is not None else split.files)
    splits = tuple(changed if s.name == split.name else s for s in graph.splits)
    return dataclasses.replace(report, graphs=(dataclasses.replace(graph, splits=splits), *report.graphs[1:]))


def test_summary_and_html_name_the_mismatching_piece():
    report = _report_with(MISMATCH)
    summary = render_summary(report)
    # every Thunder split is a piece of the check: the two without a record are not compared, and say why
    assert ("correctness (Thunder against eager on checked calls): 1 of 3 pieces MISMATCH; 2 of 3 pieces not "
            "compared (2 never run on a checked call)" in summary)
    assert "  not compared: graph0/thunder_2: no checked call ran it" in summary
    assert ("MISMATCH graph0/thunder_0: forward output 2 at call 51, error 0.31 (relative 0.05) against 0.0125 "
            "allowed (float64 eager), 24.8 x the tolerance; 2 of 3 checked calls mismatched (first at call 51)"
            in summary)
    # The script, which `thunderfx-debug minimize` takes, not the inputs file beside it.
    script_lines = [line.strip() for line in summary.splitlines() if line.strip().startswith("script")]
    assert script_lines == ["script: graph0/graph0_thunder_0/graph0_thunder_0_mismatch_thunder.py"], script_lines
    page = render_html({0: report}, {0: "rank0/"})
    assert "<h3>Correctness</h3>" in page and "1 of 3 pieces MISMATCH" in page
    assert 'href="rank0/graph0/graph0_thunder_0/graph0_thunder_0_mismatch_thunder.py"' in page
    assert "correctness" not in render_summary(_report_with(None))


def test_the_summary_ends_with_what_to_do_next():
    """The page and verify for every dump with scripts; for a mismatch not shrunk yet, minimize on its script (in the
    rank's folder, as typed), and where to file it; nothing of the kind for `report()` without a dump directory."""
    report = _report_with(MISMATCH)
    root = report.meta["config"]["dump_dir"]
    lines = render_summary(report).splitlines()
    after = lines[lines.index("next:") + 1:]
    commands = [line.split("#")[0].split() for line in after if line.startswith("  thunderfx-debug ")]
    assert commands == [["thunderfx-debug", "html", root], ["thunderfx-debug", "verify", root],
                        ["thunderfx-debug", "minimize",
                         f"{root}/rank0/graph0/graph0_thunder_0/graph0_thunder_0_mismatch_thunder.py"]]
    assert any("https://github.com/Lightning-AI/lightning-thunder/issues" in line
               and "docs/minimize-and-filing-a-bug.md" in line for line in after)
    clean = render_summary(_report_with(None))
    assert "thunderfx-debug verify" in clean and "minimize" not in clean.split("\nnext:\n")[1]
    without_dir = dataclasses.replace(report, meta={**report.meta, "config": {**report.meta["config"], "dump_dir": None}})
    assert "\nnext:\n" not in render_summary(without_dir)


def test_the_headline_names_a_region_that_writes_memory_it_does_not_own():
    report = load_report(dump_fixtures() / "normal")
    graph = report.graphs[0]
    split = next(s for s in graph.splits if s.kind is SplitKind.THUNDER)
    writer = Check(calls=2, mismatches=1, compared=9, first_mismatch_call=2, worst_call=2, worst_abs_error=2.0,
                   worst_rel_error=math.inf, worst_ratio=math.inf, rtol=0.0, atol=0.0, allowed=0.0,
                   worst_output="output 1 (t1) of nvFusion0_forward changed while TorchCompile0 ran (it is not an "
                                "output of TorchCompile0)", reference="its own value when it was returned (or received)",
                   writes_unowned_memory=True)
    fusions = (dataclasses.replace(split.fusions[0], check=writer), *split.fusions[1:])
    changed = dataclasses.replace(split, check=Check(calls=2, compared=4), fusions=fusions)
    splits = tuple(changed if s.name == split.name else s for s in graph.splits)
    report = dataclasses.replace(report, graphs=(dataclasses.replace(graph, splits=splits), *report.graphs[1:]))
    summary = render_summary(report)
    region = f"graph0/{split.name}/{split.fusions[0].qualified_name}"
    headline = next(line for line in summary.splitlines() if line.startswith("correctness"))
    assert headline.endswith(f"; {region} writes memory it does not own")
    assert f"MISMATCH {region}: writes memory it does not own: output 1 (t1)" in summary
    assert "writes memory it does not own" in render_html({0: report}, {0: "rank0/"})


def test_diff_shows_the_mismatches_new_in_the_second_run():
    clean = dataclasses.replace(MISMATCH, mismatches=0, first_mismatch_call=None, worst_ratio=0.3)
    text = render_diff(diff_reports(_report_with(clean), _report_with(MISMATCH)))
    assert "correctness: 1 pieces mismatch eager in B and did not in A:" in text
    assert "MISMATCH graph0/thunder_0: forward output 2 at call 51" in text
    assert "correctness" not in render_diff(diff_reports(_report_with(MISMATCH), _report_with(MISMATCH)))
    assert "correctness" not in render_diff(diff_reports(_report_with(MISMATCH), _report_with(clean)))
