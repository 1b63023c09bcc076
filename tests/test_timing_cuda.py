"""Timing on CUDA with nvFuser: CUDA events around every nvFusion region on exactly the sampled calls, no change in
any number, and no device synchronisation on unsampled steps (`torch.cuda.set_sync_debug_mode("error")`).

Run on a GPU machine: `python -m pytest tests/test_timing_cuda.py -q -m cuda`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import failing_every_other_trace, tiny_gpt, train

pytestmark = pytest.mark.cuda

STEPS, EVERY, WARMUP = 8, 3, 1
SAMPLED = (2, 5, 8)


def _train(**options):
    from thunderfx_debug import ReportingBackend

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0, device="cuda")
    backend = ReportingBackend(**{"strict": True, **options})  # Thunder's default executors: nvFuser fuses on CUDA
    compiled = torch.compile(model, backend=backend)
    losses = train(compiled, model, config, STEPS, device="cuda")
    torch.cuda.synchronize()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return backend, losses, params


@pytest.fixture(scope="module")
def runs():
    off = _train(timing="off")
    fusion = _train(timing="fusion", timing_every=EVERY, timing_warmup=WARMUP)
    yield off, fusion
    torch._dynamo.reset()


def _differences(a, b) -> list[str]:
    (_, a_losses, a_params), (_, b_losses, b_params) = a, b
    names = ["losses"] if not torch.equal(a_losses, b_losses) else []
    return names + [name for name in a_params if not torch.equal(a_params[name], b_params[name])]


def _assert_same_numbers(off, other) -> None:
    differences = _differences(off, other)
    if differences:  # tell a real difference from a baseline that differs from itself (atomics in some kernels)
        again = _differences(off, _train(timing="off"))
        assert not again, f"two runs without timing differ already ({again}); this check needs a deterministic run"
    assert not differences, differences


def test_fusion_timing_changes_no_number_on_cuda(runs):
    _assert_same_numbers(*runs)


def test_a_cuda_mark_that_fails_drops_its_trace_and_the_training_goes_on_unchanged(runs, monkeypatch):
    """The marks run inside Thunder's traces on the training's forward and backward (behind the device hold): where
    recording one raises, that trace records nothing more, the failure is reported, and no number changes."""
    from thunderfx_debug.recording.timing import CudaClock

    monkeypatch.setattr(CudaClock, "marker", failing_every_other_trace(CudaClock.marker))
    failing = _train(timing="fusion", timing_every=EVERY, timing_warmup=WARMUP, strict=False)
    _assert_same_numbers(runs[0], failing)
    report = failing[0].report()
    failed = [f for f in report.meta["reporting_failures"] if f["what"].startswith("timing the fusion regions")]
    assert failed and all("illegal memory access" in f["error"] for f in failed), report.meta
    kept = [f.timing.calls for g in report.graphs for _, f in g.fusions() if f.timing is not None]
    assert kept and all(set(calls) <= set(SAMPLED) for calls in kept), kept  # the traces that did not fail


def test_a_small_timing_share_holds_and_marks_only_the_timed_calls_and_changes_no_number(runs):
    """THUNDERFX_DEBUG_TIMING_SHARE: a sampled call passed over runs as an unsampled one (no hold, no mark); the
    first two sampled calls are timed (the first is not charged, the second is charged its whole period)."""
    shared = _train(timing="fusion", timing_every=1, timing_warmup=WARMUP, timing_share=0.001)
    _assert_same_numbers(runs[0], shared)
    report = shared[0].report()
    timed = (WARMUP + 1, WARMUP + 2)
    for graph in report.graphs:
        assert graph.timing.calls == timed and graph.timing_passed_over == STEPS - WARMUP - len(timed)
        regions = [f for _, f in graph.fusions()]
        assert regions and all(f.timing.calls == timed for f in regions), [(f.name, f.timing) for f in regions]
    holds = [state.timed_calls.hold for state in shared[0].recorder.graphs]
    # each graph's hold slept once per phase (forward, backward) of each timed call
    assert [sum(n for n, _ in h.sleeps.values()) for h in holds] == [2 * len(timed)] * len(holds), \
        [h.sleeps for h in holds]


def test_every_nvfusion_region_is_timed_with_cuda_events_on_the_sampled_calls(runs):
    backend = runs[1][0]
    report = backend.report()  # after synchronize: every event is complete, nothing waits
    fusions = [(s, f) for g in report.graphs for s, f in g.fusions()]
    assert {f.phase.value for _, f in fusions} == {"forward", "backward"}
    assert any(f.name.startswith("nvFusion") for _, f in fusions)
    for split, fusion in fusions:
        assert fusion.timing is not None and fusion.timing.calls == SAMPLED, (split.name, fusion.qualified_name)
        assert fusion.timing.clock == "cuda"
        assert all(ms > 0 for ms in fusion.timing.samples_ms)
    for graph in report.graphs:
        for split in graph.splits:
            if split.fusions:
                assert sorted(split.outside_fusions_timing) == ["outside_backward", "outside_forward"]
                for timing in split.outside_fusions_timing.values():
                    assert timing.calls == SAMPLED


def test_sampled_calls_read_host_wall_time_beside_device_time_and_ops_outside_regions_are_grouped(runs):
    from thunderfx_debug.records import BETWEEN_OPS, CostStage, Phase

    report = runs[1][0].report()
    for graph in report.graphs:
        assert graph.host_timing.clock == "host" and graph.host_timing.calls == SAMPLED
        assert graph.host_backward_timing.calls == SAMPLED
        assert graph.period_timing.calls == SAMPLED[:-1]  # the last sampled call has no next call
        for split in graph.splits:
            assert split.host_timing.calls == SAMPLED, split.name
    thunder = [(g, s) for g in report.graphs for s in g.splits if s.op_groups]
    assert thunder and any(og.symbol != BETWEEN_OPS for _, s in thunder for og in s.op_groups)
    for _, split in thunder:
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            outside = split.outside_fusions_timing[f"outside_{phase.value}"]
            groups = [og.timing for og in split.op_groups if og.phase is phase]
            for i, call in enumerate(outside.calls):
                total = sum(t.samples_ms[t.calls.index(call)] for t in groups)
                assert total == pytest.approx(outside.samples_ms[i], rel=1e-3, abs=1e-4), (split.name, phase, call)
        # nvFuser compiles each fusion at its first execution: that part of the first call is nvFuser's.
        assert split.compile_cost.seconds(CostStage.FIRST_EXECUTION) > 0
    first_step = next(line for line in str(report).splitlines() if line.startswith("time to first step"))
    assert "nvFuser compiles its fusions in them" in first_step


def test_a_component_built_for_another_torch_is_warned_about(runs):
    """The H200 bundle's nvFuser is a torch-2.10 wheel (nvfuser-cu130-torch210) run on torch 2.11."""
    import importlib.metadata
    import re

    report = runs[1][0].report()
    running = ".".join(torch.__version__.split(".")[:2])
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        built = re.search(r"-torch(\d)(\d+)$", name)
        if name.startswith("nvfuser") and built and f"{built[1]}.{built[2]}" != running:
            assert any(w.startswith(dist.metadata["Name"]) and "results may be wrong" in w
                       for w in report.meta["environment_warnings"]), report.meta["environment_warnings"]
            break
    else:
        pytest.skip("no nvFuser wheel built for another torch is installed here")


def _train_unsampled_steps_in_sync_error_mode(**options):
    """Warms up (compile, the first sampled call), then trains steps that are not sampled with any synchronisation
    of the device an error. The batches are copied to the device before: a copy from pageable host memory
    synchronises by itself."""
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import synthetic_batches

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0, device="cuda")
    backend = ReportingBackend(strict=True, **options)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = synthetic_batches(config, batch_size=4, device="cuda")
    steps = [next(batches) for _ in range(12)]
    torch.cuda.synchronize()

    def step(tokens, targets):
        loss = compiled(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    warmup = options["timing_warmup"] + 1  # the warm-up calls and the first sampled one
    for tokens, targets in steps[:warmup]:
        step(tokens, targets)
    torch.cuda.synchronize()
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for tokens, targets in steps[warmup:]:
            losses.append(step(tokens, targets))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return backend, torch.stack(losses)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(dict(timing_warmup=5), id="defaults"),  # graph timing every 50 calls
        pytest.param(dict(timing="fusion", timing_every=50, timing_warmup=2), id="fusion"),
        pytest.param(dict(timing="fusion", timing_every=50, timing_warmup=2, nvtx=True), id="fusion+nvtx"),
        # the correctness sentinel checks call 1 (in the warm-up) and 51: the calls between pay nothing
        pytest.param(dict(timing_warmup=2, check="fusion", check_every=50), id="check-fusion"),
        # within a share, the graph reads the host clock around the checked call's period, no more
        pytest.param(dict(timing_warmup=2, check="fusion", check_every=50, check_share=1), id="check-fusion-share"),
    ],
)
def test_unsampled_steps_never_synchronise_the_device(options):
    backend, losses = _train_unsampled_steps_in_sync_error_mode(**options)
    assert torch.isfinite(losses).all()
    report = backend.report()
    assert all(g.timing.calls == (options["timing_warmup"] + 1,) for g in report.graphs)  # sampled once, before
