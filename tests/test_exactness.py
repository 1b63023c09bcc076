"""ReportingBackend computes exactly what plain ThunderCompiler computes: same losses, same parameters."""

from __future__ import annotations

import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug import ReportingBackend
from thunderfx_debug.thunder.compile import plain_thunder_compiler

STEPS = 12


def _run(make_backend):
    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0)
    backend = make_backend()
    losses = train(torch.compile(model, backend=backend), model, config, STEPS)
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}, backend


def test_losses_and_parameters_match_plain_thundercompiler(tmp_path, one_thread):
    plain_losses, plain_params, _ = _run(lambda: plain_thunder_compiler(executors=cpu_executors()))
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
