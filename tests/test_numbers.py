"""The numbers of real (CPU) Thunder runs: compile cost as felt, every microsecond of a split attributed to its regions
and op groups, the host's side of sampled calls, one quantity for the word "step" wherever the run is rendered, and a
diff of two identical runs that flags nothing.

Nothing is timed against a threshold: the tests check that the parts of each figure are those of the run (the
regions and op groups of a call add up to its trace, the compile parts lie inside the first call), and that the
statistics say what the samples allow."""

from __future__ import annotations

import dataclasses
import html
import re
from collections import Counter

import pytest
import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug.records import (
    BETWEEN_OPS, ClockKind, CostStage, CostWhen, Phase, SplitKind, Steps, Timing, Triage,
)
from thunderfx_debug.render import accounting, digest, triage_findings
from thunderfx_debug.render.diff import diff_reports, render_diff
from thunderfx_debug.render.headline import MIN_SAMPLES
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.noise import ChangeOutcome

STEPS, EVERY, WARMUP = 8, 3, 1
SAMPLED = (2, 5, 8)


def _run(executors=None, steps=STEPS, **options):
    from thunderfx_debug import ReportingBackend

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0, **options.pop("model", {}))
    backend = ReportingBackend(strict=True, **({"executors": executors} if executors else {}), **options)
    losses = train(torch.compile(model, backend=backend), model, config, steps)
    return backend.report(), losses


@pytest.fixture(scope="module")
def one_thread():
    # One CPU thread: several reduce in an order that varies between runs (and two busy threads double the noise).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def fused(one_thread):
    """The tiny GPT (a graph break, torch.sinc sent to inductor) with Thunder's torch.compile executor: TorchCompile
    regions, which compile at their first execution (Dynamo reports those compiles), and an inductor split."""
    report, _ = _run(cpu_executors(), timing="fusion", timing_every=EVERY, timing_warmup=WARMUP)
    return report


@pytest.fixture(scope="module")
def ops(one_thread):
    """Thunder's default executors on CPU fuse nothing: every op of a split runs outside fusion regions, by the torch
    executor. Two identical runs, and one without timing for the losses."""
    settings = dict(timing="fusion", timing_every=1, timing_warmup=2, model={"sinc_gate": False})
    first, losses = _run(steps=24, **settings)
    second, _ = _run(steps=24, **settings)
    _, plain_losses = _run(steps=24, timing="off", model={"sinc_gate": False})
    return first, second, losses, plain_losses


# ---- compile cost as felt -----------------------------------------------------------------------------------------
def test_each_graph_and_split_has_its_first_call_cost_in_parts(fused):
    for graph in fused.graphs:
        cost = graph.compile_cost
        assert cost.forward_s > 0 and cost.backward_s > 0, graph.name
        assert cost.started_s < cost.ended_s
        assert cost.seconds(CostStage.BACKEND) == pytest.approx(graph.compile_time_s, abs=0.05)
        assert cost.seconds(CostStage.DYNAMO) > 0  # Dynamo's compile of the frame, less the backend call
        splits_forward = sum(s.compile_cost.forward_s for s in graph.splits)
        assert splits_forward <= cost.forward_s  # the splits' first calls run inside the graph's
        for split in graph.splits:
            split_cost = split.compile_cost
            for when, wall in ((CostWhen.FORWARD, split_cost.forward_s), (CostWhen.BACKWARD, split_cost.backward_s)):
                parts = sum(p.seconds for p in split_cost.parts if p.when is when)
                assert 0 < parts <= wall * 1.0001 + 1e-6, (graph.name, split.name, when)
            assert cost.started_s <= split_cost.started_s and split_cost.ended_s <= cost.ended_s + 1e-6


def test_thunder_splits_show_tracing_transforms_and_the_kernel_compiles_of_their_regions(fused):
    thunder = [s for g in fused.graphs for s in g.splits if s.kind is SplitKind.THUNDER and s.fusions]
    assert thunder
    for split in thunder:
        cost = split.compile_cost
        assert cost.seconds(CostStage.THUNDER_TRACING) > 0 and cost.seconds(CostStage.THUNDER_TRANSFORMS) > 0
        # TorchCompile regions are torch.compile'd at their first execution: Dynamo reports those compiles.
        assert cost.seconds(CostStage.KERNEL_COMPILES, CostWhen.FORWARD) > 0, split.name
        assert cost.seconds(CostStage.KERNEL_COMPILES, CostWhen.BACKWARD) > 0, split.name


def test_the_inductor_split_compiles_at_its_first_call(fused):
    (inductor,) = [s for g in fused.graphs for s in g.splits if s.kind is SplitKind.INDUCTOR]
    assert inductor.compile_cost.seconds(CostStage.INDUCTOR_COMPILE) > 0
    assert inductor.compile_cost.seconds(CostStage.INDUCTOR_COMPILE) <= inductor.compile_cost.forward_s


def test_the_summary_leads_with_the_time_to_first_step(fused):
    step = accounting.first_step(fused)
    assert step.graphs == ("graph0", "graph1")
    assert step.seconds >= sum(step.parts.values())
    first = max(fused.graphs, key=lambda g: g.compile_cost.ended_s).compile_cost.ended_s
    assert step.seconds == pytest.approx(first - fused.graphs[0].compile_cost.started_s)
    lines = str(fused).splitlines()
    assert lines[1].startswith(f"time to first step: {step.seconds:.1f} s")
    assert "Thunder tracing" in lines[1] and "kernel compiles" in lines[1]
    assert "nvFuser" not in lines[1]  # a CPU run: no nvFuser to name


# ---- every microsecond attributed ---------------------------------------------------------------------------------
def _by_call(timing):
    return dict(zip(timing.calls, timing.samples_ms))


def test_op_groups_add_up_to_the_time_outside_regions_on_every_sampled_call(ops):
    report = ops[0]
    splits = [(g, s) for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    assert splits
    for graph, split in splits:
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            groups = [g for g in split.op_groups if g.phase is phase]
            labels = {g.label for g in groups}
            assert f"{BETWEEN_OPS} [thunder]" in labels
            outside = _by_call(split.outside_fusions_timing[f"outside_{phase.value}"])
            assert outside and all(g.timing.calls == tuple(outside) for g in groups)
            for call, ms in outside.items():
                assert sum(_by_call(g.timing)[call] for g in groups) == pytest.approx(ms, rel=1e-9, abs=1e-9)
                total = _by_call(split.timing if phase is Phase.FORWARD else split.backward_timing)[call]
                assert ms <= total  # the trace runs inside the split's call


def test_op_groups_count_the_traces_ops_by_symbol_and_executor(ops, one_thread):
    import thunder

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.thunder.instrument import is_op, op_executor, without_marks

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0, sinc_gate=False)
    backend = ReportingBackend(timing="fusion", timing_every=1, timing_warmup=0, strict=True)
    train(torch.compile(model, backend=backend), model, config, 2)
    report = backend.report()
    for state in backend.recorder.graphs:
        for split_state in state.splits:
            split = report.graph(state.name).split(split_state.name)
            traces = (thunder.last_traces(split_state.split.compiled)[-1],
                      thunder.last_backward_traces(split_state.split.compiled)[-1])
            for phase, trace in zip((Phase.FORWARD, Phase.BACKWARD), traces):
                expected = Counter((b.sym.name, op_executor(b)) for b in without_marks(trace).bound_symbols if is_op(b))
                counted = {(g.symbol, g.executor): g.count for g in split.op_groups
                           if g.phase is phase and g.symbol != BETWEEN_OPS}
                assert counted == dict(expected), (split.name, phase)
                assert any(symbol in ("linear", "matmul") for symbol, _ in expected)


def test_marking_ops_changes_no_number(ops):
    _, _, losses, plain = ops
    assert torch.equal(losses, plain)


def test_a_split_is_accounted_for_part_by_part(ops):
    report = ops[0]
    graph = report.graphs[0]
    split = graph.split("thunder_0")
    total, parts = accounting.split_parts(graph, split, Phase.FORWARD)
    labels = [p.label for p in parts]
    assert accounting.OUTSIDE_TRACE in labels and "linear [torch]" in labels
    assert {p.label for p in parts} - {accounting.OUTSIDE_TRACE} == {g.label for g in split.op_groups
                                                                    if g.phase is Phase.FORWARD}
    text = str(report)
    assert "forward by part (host time" in text and "linear [torch] x4" in text


# ---- the host's side -----------------------------------------------------------------------------------------------
def test_sampled_calls_read_the_step_and_thunders_own_host_time(ops):
    report = ops[0]
    sampled = tuple(range(3, 25))
    for graph in report.graphs:
        assert graph.host_timing is None  # a CPU run: the graph's own clock is the host's
        assert graph.period_timing.calls == sampled[:-1]  # the last sampled call has no next call
        assert all(ms > 0 for ms in graph.period_timing.samples_ms)
        for split in graph.splits:
            assert split.thunder_overhead_timing.calls == sampled
            assert all(ms > 0 for ms in split.thunder_overhead_timing.samples_ms)
    account = accounting.step_account(report)
    assert account.wall_ms > 0 and account.idle_share is None  # no GPU to idle
    assert account.wall_graph is None and account.steps.counted  # AdamW's steps measured it, every one of them
    assert "on CPU, device time is host time" in str(report)


# ---- one word, one quantity ---------------------------------------------------------------------------------------
def _triaged(report, triage: Triage):
    """`report` with `triage` on each of its Thunder splits, as a flush-time triage leaves them."""
    graphs = [dataclasses.replace(g, splits=tuple(dataclasses.replace(s, triage=triage)
                                                  if s.kind is SplitKind.THUNDER else s for s in g.splits))
              for g in report.graphs]
    return dataclasses.replace(report, graphs=tuple(graphs))


#: A figure in ms that a rendering names "step" ("step: 8.502 ms", "the run's step: ...", "Step: ..."); "per step"
#: names a rate, not the step.
_NAMED_STEP = re.compile(r"(?<!per )\bstep\b(?: \(estimated\))?:?\s+(\d+\.\d+) ms", re.IGNORECASE)


def test_the_word_step_names_the_measured_step_and_nothing_else(ops):
    """The summary's headline, the triage's totals and the HTML page name "step" the step's wall time (host clock)
    alone; the time in the compiled graphs per step, a part of the step on CPU (eager code, the optimizer and the
    loss lie outside every graph), is named as such wherever it is shown."""
    report = _triaged(ops[0], Triage(thunder_ms=2.0, inductor_ms=1.0, ratio=2.0, ratio_low=1.8, ratio_high=2.2,
                                     deviates=True, rounds=21))
    wall, compiled = accounting.wall_step_ms(report), digest.compiled_ms_per_step(report)
    assert 0 < compiled < wall
    totals = triage_findings.totals(report)
    assert (totals.wall_ms, totals.compiled_ms) == (wall, compiled)
    page = re.sub(r"<[^>]+>", " ", render_html({0: report}))
    renderings = {"summary": str(report), "triage.md": triage_findings.render_triage_md(report), "html": page}
    for name, text in renderings.items():
        named = _NAMED_STEP.findall(text)
        assert named and set(named) == {f"{wall:.3f}"}, (name, named)
    assert f"the time in its compiled graphs per step: {compiled:.3f} ms (host clock)" in renderings["triage.md"]
    assert re.search(rf"time in the compiled graphs per step\s+{compiled:.3f} ms", page)


def test_a_figure_that_rests_on_too_few_samples_says_so_next_to_the_number(fused, ops):
    """`fused` sampled 3 of its 8 steps: the time in its compiled graphs per step rests on fewer than MIN_SAMPLES
    samples, and the summary's headline and the page say so next to the number; a step's wall time measured on two
    optimizer steps says so too. A triaged piece whose own time in the run rests on too few samples is not set beside
    the triage's: its time lost per step comes from the triage's own times, and the summary, triage.md and the page
    say why. `ops`, sampled on 22 of its 24 steps, says nothing of the kind."""
    def triaged(report):
        split = next(s for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER)
        # What the report sets beside a triaged split: the run's own samples of it (report_builder).
        return _triaged(report, Triage(thunder_ms=2.0, inductor_ms=1.0, ratio=2.0, ratio_low=1.8, ratio_high=2.2,
                                       deviates=True, rounds=21, run_ms=1.0, run_samples=split.timing.count))

    thin, plenty = triaged(fused), triaged(ops[0])
    account = accounting.step_account(thin)
    assert int(re.fullmatch(r"too few samples \((\d+)\)", account.busy_flag)[1]) < MIN_SAMPLES
    summary = str(thin)
    assert f"{account.busy_ms:.3f} ms [{account.busy_flag}] (" in summary
    two_steps = dataclasses.replace(thin, meta={**thin.meta, "steps": Steps(3, 1, Timing(
        (5.0, 5.5), (2, 3), ClockKind.HOST)).to_json()})
    short = accounting.step_account(two_steps)
    assert (short.wall_ms, short.wall_flag) == (5.5, "too few samples (1)")  # the first interval left out
    assert "step: 5.500 ms [too few samples (1)] wall time" in str(two_steps)
    assert "Step: 5.500 ms [too few samples (1)] wall time" in render_html({0: two_steps})
    triage = thin.graphs[0].splits[0].triage
    assert triage.run_too_thin and not triage.lost_from_the_run
    assert triage.ms_per_step == pytest.approx((2.0 - 1.0) * triage.calls_per_step)  # the triage's own times
    said = (f"the run's own time of it rests on {triage.run_samples} samples (fewer than {MIN_SAMPLES}")
    assert said in triage_findings.render_triage_md(thin) and said in html.unescape(render_html({0: thin}))
    section = triage_findings.html_section(thin)  # the page's table has what triage.md's has beside each piece
    assert "<th>run ms</th>" in section and "<th>calls per step</th>" in section
    assert "from the triage's own times: the run sampled it" in "\n".join(triage_findings.summary_lines(thin))
    sure = accounting.step_account(plenty)
    assert (sure.wall_flag, sure.busy_flag) == (None, None)
    t = plenty.graphs[0].splits[0].triage
    assert t.run_samples >= MIN_SAMPLES and t.lost_from_the_run
    step_line = next(line for line in str(plenty).splitlines() if line.startswith("step: "))
    assert "[too few samples" not in step_line + triage_findings.render_triage_md(plenty)
    assert "too few to use" not in triage_findings.render_triage_md(plenty)


# ---- a diff without false alarms -----------------------------------------------------------------------------------
def test_two_identical_runs_show_no_timing_change(ops):
    first, second, _, _ = ops
    d = diff_reports(first, second)
    assert len(d.timings) > 40 and not d.structure_changed
    # Two identical runs flag a piece by chance in up to ALPHA (5%) of diffs: the family-wise level, which
    # tests/test_noise.py holds over many simulated runs. One real pair of runs can only show that no flag survives a
    # level 50 times stricter (Holm's first threshold at 0.001), which a diff of the wrong samples or units would not.
    judged = [t for t in d.timings if t.change.p_value is not None]
    strict = [t for t in d.significant_timings if t.change.p_value < 0.001 / len(judged)]
    assert strict == [], render_diff(d)


def test_a_piece_made_one_and_a_half_times_slower_is_flagged_where_the_samples_can_tell(ops):
    first, second, _, _ = ops
    d = diff_reports(first, second)
    judged = [t for t in d.timings if t.change.resolution is not None and t.level is digest.PieceLevel.SPLIT]
    assert judged, "no split had enough samples in both runs to be judged"
    best = min(judged, key=lambda t: t.change.resolution)
    graph_name, split_name = best.path.split("/")
    slowed = _scaled(second, graph_name, split_name, best.phase, 1.5)
    change = next(t.change for t in diff_reports(first, slowed).timings
                  if (t.level, t.path, t.phase) == (best.level, best.path, best.phase))
    if best.change.resolution <= 1.3:  # precise enough that a 1.5x change cannot hide
        assert change.verdict is ChangeOutcome.SLOWER, change
    else:
        assert change.verdict in (ChangeOutcome.SLOWER, ChangeOutcome.TOO_NOISY), change


def _scaled(report, graph_name, split_name, phase, factor):
    graphs = []
    for graph in report.graphs:
        splits = []
        for split in graph.splits:
            if (graph.name, split.name) == (graph_name, split_name):
                field = "timing" if phase == "forward" else "backward_timing"
                timing = getattr(split, field)
                split = dataclasses.replace(split, **{field: dataclasses.replace(
                    timing, samples_ms=tuple(factor * ms for ms in timing.samples_ms))})
            splits.append(split)
        graphs.append(dataclasses.replace(graph, splits=tuple(splits)))
    return dataclasses.replace(report, graphs=tuple(graphs))
