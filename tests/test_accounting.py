"""Where the time went, from records: the headline rule, the first step, a step's wall time against the GPU's busy
time (with CUDA-clock records as a GPU run writes them), the words that name each clock, the op marks' bookkeeping
on a fake clock, which sampled calls count as disturbed, Dynamo's compile callbacks, and the environment checks of
the manifest. No thunder compile here."""

from __future__ import annotations

import itertools

import pytest
import torch

from thunderfx_debug.recording.manifest import device_sharing, version_warnings
from thunderfx_debug.records import (
    BETWEEN_OPS, CompileCost, CostPart, CostStage, Disturbance, DisturbedCall, GraphRecord, OpGroup, Phase,
    RankRecord, SplitKind, SplitRecord, Timing,
)
from thunderfx_debug.recording.host import CallWaits
from thunderfx_debug.recording.timing import HostClock, RegionTimer
from thunderfx_debug.render import accounting, digest
from thunderfx_debug.render.headline import headline
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_summary

CALLS = tuple(range(6, 56, 5))  # ten sampled calls


def timing(ms: float, clock: str = "cuda", first: float | None = None, calls=CALLS) -> Timing:
    """Ten samples of about `ms` (1% apart), the first one `first` where given (a cold call)."""
    samples = [ms * (1 + 0.01 * (i % 3)) for i in range(len(calls))]
    if first is not None:
        samples[0] = first
    return Timing(tuple(samples), tuple(calls), clock)


def gpu_run() -> RankRecord:
    """A host-bound step on the GPU: 12.5 ms between graph0's calls, 4.5 ms of it in the graph on the device."""
    split = SplitRecord("thunder_0", SplitKind.THUNDER, timing=timing(1.4), backward_timing=timing(2.9),
                        host_timing=timing(3.9, "host"), host_backward_timing=timing(7.8, "host"),
                        thunder_overhead_timing=timing(1.2, "host"))
    graph = GraphRecord("graph0", 0, calls=60, splits=(split,), timing=timing(1.5, first=30.0),
                        backward_timing=timing(3.0), host_timing=timing(4.0, "host"),
                        host_backward_timing=timing(8.0, "host"), period_timing=timing(12.5, "host"))
    return RankRecord(graphs=(graph,), meta={"config": {"timing": "split"}})


# ---- headline ---------------------------------------------------------------------------------------------------
def test_the_headline_leaves_out_the_first_sampled_call_and_disturbed_calls_and_says_when_it_is_thin():
    cold = timing(1.0, first=30.0)
    assert headline(cold).samples_ms == cold.samples_ms[1:] and headline(cold).left_out == 1
    assert headline(cold).median_ms == pytest.approx(1.01)  # the raw median would be the same, the mean would not
    left_out = headline(cold, {11, 16, 21, 26, 31, 36})
    assert left_out.count == 3 and left_out.flag == "too few samples (3)"
    wild = Timing((5.0, 1.0, 4.0, 1.1, 3.5, 0.9, 4.2), tuple(range(1, 8)))
    assert headline(wild).flag.startswith("noisy (p90")
    assert headline(timing(1.0)).flag is None
    lone = headline(Timing((7.0,), (6,)))
    assert lone.count == 0 and lone.median_ms == 7.0 and lone.flag == "too few samples (1)"


def test_a_graphs_disturbed_calls_leave_every_piece_of_it():
    run = gpu_run()
    graph = run.graphs[0]
    disturbed = RankRecord(graphs=(GraphRecord(**{**graph.__dict__, "disturbed": (
        DisturbedCall(11, Disturbance.COMPILE), DisturbedCall(16, Disturbance.PREEMPTED))}),))
    pieces = {p.label: p for p in digest.timed_pieces(disturbed)}
    assert pieces["graph0/thunder_0 forward"].headline.left_out == 3  # the first call, and calls 11 and 16
    assert "call 11 (compile), call 16 (preempted)" in render_summary(disturbed)


# ---- the first step ------------------------------------------------------------------------------------------------
def _cost(started, ended, *parts):
    return CompileCost(forward_s=ended - started, backward_s=0.1, started_s=started, ended_s=ended,
                       parts=tuple(CostPart(*p) for p in parts))


def test_the_first_step_covers_the_graphs_compiled_before_it_ended_and_names_the_rest_other():
    graph0 = GraphRecord("graph0", 0,
                         compile_cost=_cost(1.0, 31.0, ("compile", "dynamo", 0.5), ("compile", "backend", 1.5)),
                         splits=(SplitRecord("thunder_0", SplitKind.THUNDER, compile_cost=_cost(
                             3.0, 30.0, ("forward", "thunder tracing", 2.0), ("forward", "thunder transforms", 3.0),
                             ("forward", "first execution", 20.0))),))
    graph1 = GraphRecord("graph1", 1, compile_cost=_cost(10.0, 12.0, ("compile", "backend", 1.0)))
    evaluation = GraphRecord("graph2", 2, compile_cost=_cost(100.0, 105.0, ("compile", "backend", 4.0)))
    step = accounting.first_step(RankRecord(graphs=(graph0, graph1, evaluation)))
    assert step.graphs == ("graph0", "graph1")  # graph2 was compiled after the first step had ended
    assert step.seconds == pytest.approx(30.0)
    assert step.parts == {CostStage.FIRST_EXECUTION: 20.0, CostStage.THUNDER_TRANSFORMS: 3.0,
                          CostStage.BACKEND: 2.5, CostStage.THUNDER_TRACING: 2.0, CostStage.DYNAMO: 0.5}
    assert step.other_s == pytest.approx(2.0)
    gpu = RankRecord(graphs=(graph0,), meta={})
    assert "nvFuser" not in render_summary(gpu).splitlines()[1]  # nothing was timed: the clock is unknown
    timed = RankRecord(graphs=(GraphRecord(**{**graph0.__dict__, "timing": timing(1.0)}),))
    assert "first executions (nvFuser compiles its fusions in them) 20.0 s" in render_summary(timed)


# ---- wall against device -------------------------------------------------------------------------------------------
def test_a_host_bound_gpu_step_says_how_much_the_gpu_idles_and_which_pieces_take_the_host():
    run = gpu_run()
    account = accounting.step_account(run)
    assert account.wall_ms == pytest.approx(12.5 * 1.01)  # headline median of the period
    assert account.busy_ms == pytest.approx(1.5 * 1.01 + 3.0 * 1.01)
    assert account.idle_share == pytest.approx(1 - 4.5 / 12.5, abs=0.01) and account.host_bound
    assert [p.label for p in account.host_pieces] == ["graph0 backward", "graph0/thunder_0 backward",
                                                      "graph0 forward", "graph0/thunder_0 forward"]
    text = render_summary(run)
    assert "the GPU idles at least 64 % of the step" in text
    assert "graph0/thunder_0 forward: 3.939 ms / 1.414 ms, of which Thunder's own (cache check, prologue, epilogue) " \
           "1.212 ms" in text
    assert "top regions by device time" in text and "host wall median" in text
    page = render_html({0: run})
    assert "the GPU idles at least 64 % of the step" in page and "host-bound" in page


def test_a_step_the_gpu_keeps_up_with_is_not_called_host_bound():
    run = gpu_run()
    graph = run.graphs[0]
    busy = RankRecord(graphs=(GraphRecord(**{**graph.__dict__, "period_timing": timing(5.0, "host")}),))
    account = accounting.step_account(busy)
    assert account.idle_share == pytest.approx(0.1, abs=0.01) and not account.host_bound
    assert "host-bound" not in render_summary(busy)


def test_on_cpu_the_words_follow_the_host_clock():
    split = SplitRecord("thunder_0", SplitKind.THUNDER, timing=timing(1.0, "host"), backward_timing=timing(2.0, "host"))
    graph = GraphRecord("graph0", 0, calls=60, splits=(split,), timing=timing(1.1, "host"),
                        backward_timing=timing(2.1, "host"), period_timing=timing(4.0, "host"))
    text = render_summary(RankRecord(graphs=(graph,)))
    assert "top regions by host time" in text and "on CPU, device time is host time" in text
    assert "device time" not in text.replace("on CPU, device time is host time", "") and "idles" not in text


# ---- every microsecond attributed ----------------------------------------------------------------------------------
def test_op_marks_split_the_time_outside_regions_into_op_groups_that_add_up():
    ticks = itertools.count(0, 10**6)  # one millisecond per mark
    timer = RegionTimer(HostClock(counter=lambda: next(ticks)), series={})
    timer.forward_call = 6
    timer.begin_trace("forward")        # 0
    timer.mark_op("linear", "torch")    # 1: trace start -> here is between ops
    timer.mark_op("linear", "torch")    # 2
    timer.begin_region("F0_forward")    # 3: the second linear ran 2 -> 3
    timer.end_region("F0_forward")      # 4
    timer.mark_op("sdpa", "cudnn")      # 5: region end -> here is between ops
    timer.end_trace("forward")          # 6
    timer.resolve()
    assert {k: s.samples_ms for k, s in timer.series.items()} == {"F0_forward": [1.0], "outside_forward": [5.0]}
    assert {k: s.samples_ms for k, s in timer.op_series.items()} == {
        ("forward", BETWEEN_OPS, "thunder"): [2.0], ("forward", "linear", "torch"): [2.0],
        ("forward", "sdpa", "cudnn"): [1.0]}
    assert timer.op_counts == {("forward", BETWEEN_OPS, "thunder"): 0, ("forward", "linear", "torch"): 2,
                               ("forward", "sdpa", "cudnn"): 1}


def test_a_splits_parts_include_what_thunder_spends_outside_its_trace():
    split = SplitRecord(
        "thunder_0", SplitKind.THUNDER, timing=timing(2.0, "host"),
        outside_fusions_timing={"outside_forward": timing(0.9, "host")},
        op_groups=(OpGroup("linear", "torch", Phase.FORWARD, 4, timing(0.8, "host")),
                   OpGroup(BETWEEN_OPS, "thunder", Phase.FORWARD, 0, timing(0.1, "host"))),
    )
    graph = GraphRecord("graph0", 0, calls=60, splits=(split,))
    total, parts = accounting.split_parts(graph, split, Phase.FORWARD)
    assert [(p.label, round(p.median_ms, 3)) for p in parts] == [
        (accounting.OUTSIDE_TRACE, 1.111), ("linear [torch]", 0.808), ("between ops [thunder]", 0.101)]
    assert accounting.accounted_share(total, parts, graph) == pytest.approx(1.0, abs=0.01)
    top = digest.top_regions(RankRecord(graphs=(graph,)), limit=5)
    assert [p.label for p, _ in top] == ["graph0/thunder_0/linear [torch] forward (x4)",
                                         "graph0/thunder_0/between ops [thunder] forward"]


# ---- disturbed calls -----------------------------------------------------------------------------------------------
def test_a_call_is_preempted_when_it_waited_for_a_cpu_far_more_than_the_others():
    waits = CallWaits()
    for call, wait in ((6, 1), (11, 2), (16, 40), (21, 1), (26, 2)):  # of 100 ms each
        waits.add(call, Phase.FORWARD, 100 * 10**6, wait * 10**6, compiled=call == 21)
        waits.add(call, Phase.BACKWARD, 100 * 10**6, 10**6, compiled=False)
    assert waits.disturbed() == (DisturbedCall(16, Disturbance.PREEMPTED), DisturbedCall(21, Disturbance.COMPILE))
    loaded = CallWaits()
    for call in (6, 11, 16):  # a machine loaded evenly: every call waits alike, none is singled out
        loaded.add(call, Phase.FORWARD, 100 * 10**6, 50 * 10**6, compiled=False)
    assert loaded.disturbed() == ()
    many = CallWaits()
    for call in range(1, 3 * CallWaits.MAX_KEPT):  # bounded: a long run keeps the most recent
        many.add(call, Phase.FORWARD, 10**6, 0, compiled=True)
    assert len(many.disturbed()) == CallWaits.MAX_KEPT and many.disturbed()[-1].call == 3 * CallWaits.MAX_KEPT - 1


def test_dynamos_compiles_are_seen_and_counted():
    from thunderfx_debug.thunder.compile_events import SPANS

    torch._dynamo.reset()
    assert SPANS.install()
    before, started = len(SPANS.spans), SPANS.started
    compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")
    compiled(torch.ones(3))
    assert SPANS.started == started + 1 and len(SPANS.spans) == before + 1
    span = SPANS.spans[-1]
    assert span.trigger == "DYNAMO" and span.end_ns > span.start_ns
    assert SPANS.within(span.start_ns, span.end_ns) == [span]
    torch._dynamo.reset()  # removes Dynamo's callbacks: install() puts them back
    assert SPANS.install()
    torch.compile(lambda x: torch.cos(x), backend="eager")(torch.ones(3))
    assert SPANS.started == started + 2
    torch._dynamo.reset()


# ---- environment sanity ------------------------------------------------------------------------------------------
def test_components_built_for_or_requiring_another_torch_are_named():
    distributions = [("nvfuser-cu130-torch210", "0.2.36", []), ("nvfuser_cu130_torch211", "0.2.37", []),
                     ("transformer-engine", "2.1", ["torch<2.11"]), ("optree", "0.20", ['torch; extra == "torch"']),
                     ("lightning-thunder", "0.2.6", ["torch>=2.7.1"]), ("torch", "2.11.0", [])]
    warnings = version_warnings("2.11.0+cu130", distributions)
    assert warnings == [
        "nvfuser-cu130-torch210 0.2.36 was built for torch 2.10 and runs with torch 2.11.0+cu130: results may be wrong",
        "transformer-engine 2.1 requires torch<2.11 and runs with torch 2.11.0+cu130: results may be wrong",
    ]
    run = RankRecord(meta={"environment_warnings": warnings})
    assert render_summary(run).splitlines()[1].startswith("warning: nvfuser-cu130-torch210")


def test_a_shared_device_is_reported_and_an_unreadable_one_says_so():
    alone = device_sharing("GPU:0\nprocess 4242 uses 1500.000 MB GPU memory", pid=4242)
    assert alone["processes"] == [{"pid": 4242, "mb": 1500.0}] and "warning" not in alone
    # Another pid namespace (a container): our own id is not listed; only more than one process means sharing.
    foreign = device_sharing("GPU:0\nprocess 17 uses 1500.000 MB GPU memory\nprocess 18 uses 900.000 MB GPU memory",
                             pid=4242)
    assert "1 other process" in foreign["warning"] and "note" in foreign
    assert "warning" not in device_sharing("GPU:0\nprocess 17 uses 1500.000 MB GPU memory", pid=4242)
    unknown = device_sharing("pynvml module not found, please install nvidia-ml-py", pid=1)
    assert "pynvml" in unknown["unknown"] and "warning" not in unknown
