"""THUNDERFX_DEBUG_TIMING_SHARE: a graph times its sampled calls in turn, so that timing stays within a share of the
training's wall time; a sampled call passed over runs as an unsampled one, and the record counts it."""

from __future__ import annotations

import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_summary

STEPS, WARMUP = 10, 1
SAMPLED = tuple(range(WARMUP + 1, STEPS + 1))  # timing_every=1: every call after the warm-up


def _run(tmp_path, share):
    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0)
    backend = ReportingBackend(dump_dir=tmp_path / str(share), timing="fusion", timing_every=1,
                               timing_warmup=WARMUP, timing_share=share, executors=cpu_executors(), strict=True)
    losses = train(torch.compile(model, backend=backend), model, config, STEPS)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return backend, losses, params


def test_a_small_timing_share_passes_sampled_calls_over_counts_them_and_leaves_the_training_as_it_was(
        tmp_path, one_thread):
    every, every_losses, every_params = _run(tmp_path, 100)
    rare, rare_losses, rare_params = _run(tmp_path, 0.001)
    assert torch.equal(every_losses, rare_losses)
    assert all(torch.equal(every_params[name], rare_params[name]) for name in every_params)

    for graph in every.report().graphs:
        assert graph.timing.calls == SAMPLED and graph.timing_passed_over == 0
    report = load_report(rare.flush())  # the count survives the dump
    assert len(report.graphs) == 2
    for graph in report.graphs:
        # The first timed call is not charged (its instrumented traces' first runs), so the second is timed too;
        # it is charged its whole period (no ordinary call's is known yet), which a 0.001 % share takes hours to
        # earn back: every sampled call after it is passed over.
        timed = (WARMUP + 1, WARMUP + 2)
        assert graph.timing.calls == timed and graph.backward_timing.calls == timed
        assert graph.timing_passed_over == len(SAMPLED) - len(timed)
        for split in graph.splits:
            assert split.timing.calls == timed, (graph.name, split.name)
        regions = [f for _, f in graph.fusions()]
        assert regions and all(f.timing.calls == timed for f in regions), [(f.name, f.timing) for f in regions]
        overhead = [s.thunder_overhead_timing for s in graph.splits if s.kind.value == "thunder"]
        assert overhead and all(t.calls == timed for t in overhead), overhead  # Thunder's host time: timed calls only
    assert ("timing: 7 sampled calls passed over, to keep timing within THUNDERFX_DEBUG_TIMING_SHARE"
            in render_summary(report))
    assert "passed over" not in render_summary(every.report())
    assert "timing: 7 sampled calls passed over" in render_html({0: report})


def test_a_timed_call_costs_its_period_over_an_ordinary_calls_and_the_sleeps_it_asked_for():
    from thunderfx_debug.recording.sampler import TimedCalls
    from thunderfx_debug.recording.turns import Turns

    class Hold:  # what TimedCalls reads of a DeviceHold: the sleeps asked for so far, by rule
        sleeps = {"first": [0, 0.0], "whole": [0, 0.0], "lead": [0, 0.0]}

    now = [0]
    timed = TimedCalls(Turns(1.0, counter=lambda: now[0] * 10**6).join(), Hold())
    assert timed.decide(6) and timed.times(6)
    timed.charge(6, 500.0)  # the first timed call: not charged
    timed.ordinary(30.0)
    timed.ordinary(40.0)
    timed.ordinary(35.0)
    assert timed.decide(56)
    Hold.sleeps["lead"] = [2, 25.0]  # its forward and backward held the device 25 ms in all
    timed.charge(56, 95.0)
    assert timed.turn.spent_ns == (95.0 - 35.0 + 25.0) * 1e6
    now[0] = 1000
    assert not timed.decide(106) and not timed.times(106)  # 85 ms at 1 %: 8.5 s to earn back
    timed.charge(106, 33.0)  # a call passed over is an ordinary call
    assert timed.periods._recent_ms == [30.0, 40.0, 35.0, 33.0]
    assert timed.passed_over == 1
