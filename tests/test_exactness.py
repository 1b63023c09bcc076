"""ReportingBackend computes exactly what plain ThunderCompiler computes: same losses, same parameters."""

from __future__ import annotations

import pytest
import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug import ReportingBackend
from thunderfx_debug import plain_thunder_compiler

STEPS = 12


def _run(make_backend):
    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0)
    backend = make_backend()
    losses = train(torch.compile(model, backend=backend), model, config, STEPS)
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}, backend


@pytest.fixture(scope="module")
def plain():
    """Plain ThunderCompiler's losses and parameters (one intra-op thread, as the runs compared with them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses, params, _ = _run(lambda: plain_thunder_compiler(executors=cpu_executors()))
    finally:
        torch.set_num_threads(threads)
    return losses, params


def test_losses_and_parameters_match_plain_thundercompiler(tmp_path, one_thread, plain):
    plain_losses, plain_params = plain
    losses, params, backend = _run(
        lambda: ReportingBackend(
            dump_dir=tmp_path, timing="split", timing_every=3, timing_warmup=1, executors=cpu_executors(), strict=True
        )
    )
    assert torch.equal(plain_losses, losses), (plain_losses, losses)
    assert plain_losses[-1] < plain_losses[0]  # it trained
    assert plain_params.keys() == params.keys()
    for name in params:
        assert torch.equal(plain_params[name], params[name]), name
    # and it recorded while doing so
    report = backend.report()
    assert [g.calls for g in report.graphs] == [STEPS, STEPS]
    assert report.graphs[0].timing.count == len(range(2, STEPS + 1, 3))


def test_with_every_feature_switched_on_training_is_bit_for_bit_plain_thundercompilers(tmp_path, one_thread, plain):
    """Timing of every fusion region on every call (within half of the training's time, THUNDERFX_DEBUG_TIMING_SHARE),
    the sentinel at fusion level on every other call (within half of it too, THUNDERFX_DEBUG_CHECK_SHARE), every
    repro script with real inputs, the flush-time triage of every split and region against inductor (at a periodic
    flush during training, and at the last one), the minimizer: none of it may change what the model computes."""
    plain_losses, plain_params = plain
    losses, params, backend = _run(
        lambda: ReportingBackend(
            dump_dir=tmp_path, repro="all", inputs="real", timing="fusion", timing_every=1, timing_warmup=0,
            timing_share=50, check="fusion", check_every=2, check_share=50, triage="fusion", minimize=True,
            flush_every=1.0,
            executors=cpu_executors(), strict=True,
        )
    )
    assert torch.equal(plain_losses, losses), (plain_losses, losses)
    for name in params:
        assert torch.equal(plain_params[name], params[name]), name
    # and every feature ran: a periodic flush during training (which triages), the sentinel, fusion timing
    backend.flush()
    assert "periodic" in [f.kind for f in backend.flush_history], backend.flush_history
    report = backend.report()
    thunder = [s for g in report.graphs for s in g.splits if s.kind.value == "thunder"]
    assert thunder and all(s.check is not None and s.check.calls > 0 and s.check.mismatches == 0 for s in thunder)
    _assert_judged(thunder)
    assert any(f.timing is not None and f.timing.count > 0 for s in thunder for f in s.fusions)


def _assert_judged(thunder_splits) -> None:
    """Every Thunder split and every fusion region of it was timed against inductor: a triage that died, was killed
    or failed is a verdict of its own, and would not do here."""
    pieces = [(s.name, s.triage) for s in thunder_splits] + [
        (f"{s.name}/{f.name}_{f.phase.value}", f.triage) for s in thunder_splits for f in s.fusions]
    unjudged = {name: (t.error.splitlines()[0] if t is not None and t.error else t) for name, t in pieces
                if t is None or t.error is not None}
    assert not unjudged, unjudged


@pytest.mark.cuda
def test_on_cuda_with_every_feature_switched_on_a_zoo_decoder_trains_bit_for_bit_as_plain_thundercompiler(tmp_path):
    """The same on the H200's kind of run: a Hugging Face Qwen3 (tiny, bf16, Thunder's default executors, nvFuser)
    with every feature on, both shares below 100, against plain ThunderCompiler, deterministic algorithms on (plain
    ThunderFX itself varies from run to run on CUDA otherwise)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import harness_path  # noqa: F401
    import harness

    def run(backend):
        torch._dynamo.reset()
        model, batch = harness.build("qwen3", "tiny", "cuda", "bfloat16")
        losses = torch.stack(harness.train(model, batch, backend, steps=8))
        return losses, [p.detach().clone() for p in model.parameters()], backend

    torch.use_deterministic_algorithms(True)
    try:
        plain_losses, plain_params, _ = run(plain_thunder_compiler())
        losses, params, backend = run(ReportingBackend(
            dump_dir=tmp_path, repro="all", inputs="real", timing="fusion", timing_every=1, timing_warmup=0,
            timing_share=50, check="fusion", check_every=2, check_share=50, triage="fusion", flush_every=0,
            strict=True))
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(plain_losses, losses), (plain_losses, losses)
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    print(f"bit-equal to plain over {len(losses)} steps; flushing")
    backend.flush()  # the triage of every split and region, in processes of their own
    thunder = [s for g in backend.report().graphs for s in g.splits if s.kind.value == "thunder"]
    assert thunder and all(s.check is not None and s.check.calls > 0 and s.check.mismatches == 0 for s in thunder)
    _assert_judged(thunder)
