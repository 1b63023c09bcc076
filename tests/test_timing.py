"""Timing: which calls are sampled, how pending marks resolve, and fusion-level timing on a real Thunder run (CPU).

The sampling logic runs on fake clocks with exact expected samples; the real run checks that every TorchCompile
region of the forward and backward traces was timed on exactly the sampled calls, and that instrumenting the traces
changed no number.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import cpu_executors, failing_every_other_trace, tiny_gpt, train
from thunderfx_debug.records import ClockKind, Phase
from thunderfx_debug.recording.sampler import PhaseSampler
from thunderfx_debug.recording.timing import DeviceHold, HostClock, Ranges, RegionTimer, SampleSeries, Sampling
from thunderfx_debug.settings.safety import ReportingFailures

MS = 1_000_000  # nanoseconds


class FakeEvent:
    def __init__(self, time_ms: float):
        self.time_ms = time_ms
        self.done = False


class FakeDeviceClock:
    """Marks like CUDA events: not complete until the test says so (`complete()`), waited for only when asked."""

    kind = ClockKind.CUDA

    def __init__(self):
        self.now_ms = 0.0
        self.marks: list[FakeEvent] = []
        self.waits = 0
        self.recycled: list[FakeEvent] = []

    def mark(self) -> FakeEvent:
        event = FakeEvent(self.now_ms)
        self.now_ms += 1.0
        self.marks.append(event)
        return event

    def complete(self) -> None:
        for event in self.marks:
            event.done = True

    def elapsed_ms(self, start: FakeEvent, end: FakeEvent, wait: bool) -> float | None:
        if not end.done:
            if not wait:
                return None
            self.waits += 1
            end.done = True
        return end.time_ms - start.time_ms

    def recycle(self, marks) -> None:
        self.recycled.extend(marks)


class CountingHostClock(HostClock):
    """A host clock whose marks are 1 ms apart, counting the marks it made."""

    def __init__(self):
        ticks = itertools.count(0, MS)
        super().__init__(counter=lambda: next(ticks))
        self.count = 0

    def mark(self) -> int:
        self.count += 1
        return super().mark()


def sampled(sampling: Sampling, calls: int) -> list[int]:
    return [call for call in range(1, calls + 1) if sampling.is_sampled(call)]


# ---- Sampling -------------------------------------------------------------------------------------------------------
def test_sampling_takes_every_nth_call_after_the_warmup():
    assert sampled(Sampling(every=3, warmup=1), 10) == [2, 5, 8]
    assert sampled(Sampling(every=50, warmup=5), 120) == [6, 56, 106]
    assert sampled(Sampling(every=1, warmup=0), 4) == [1, 2, 3, 4]
    assert sampled(Sampling(every=2, warmup=3), 3) == []
    assert sampled(Sampling(every=1, warmup=0, enabled=False), 10) == []


# ---- SampleSeries ---------------------------------------------------------------------------------------------------
def test_pending_marks_resolve_on_a_later_call_without_waiting():
    clock = FakeDeviceClock()
    series = SampleSeries(clock)
    assert series.timing() is None
    series.add(6, clock.mark(), clock.mark())
    series.resolve()
    assert (series.samples_ms, series.pending) == ([], 1)  # not complete: left for later, nobody waited
    clock.complete()
    series.resolve()
    assert (series.samples_ms, series.calls, series.pending, clock.waits) == ([1.0], [6], 0, 0)


def test_flush_waits_for_what_is_still_pending_and_timing_orders_by_call():
    clock = FakeDeviceClock()
    series = SampleSeries(clock)
    late = (clock.mark(), clock.mark(), clock.mark())  # a 2 ms sample, recorded first, completed last
    early_start, early_end = clock.mark(), clock.mark()
    early_start.done = early_end.done = True
    series.add(56, late[0], late[2])
    series.add(6, early_start, early_end)
    series.resolve()
    assert (series.calls, series.pending) == ([6], 1)
    series.resolve(wait=True)
    assert clock.waits == 1
    timing = series.timing()
    assert (timing.calls, timing.samples_ms, timing.clock) == ((6, 56), (1.0, 2.0), ClockKind.CUDA)


def test_a_series_gives_the_marks_it_read_back_to_its_clock_and_keeps_the_others():
    clock = FakeDeviceClock()
    series = SampleSeries(clock)
    first, second = (clock.mark(), clock.mark()), (clock.mark(), clock.mark())
    series.add(2, *first)
    series.add(5, *second)
    first[1].done = True
    series.resolve()
    assert (series.calls, series.pending, clock.recycled) == ([2], 1, list(first))
    series.resolve(wait=True)
    assert (series.calls, series.samples_ms, clock.recycled) == ([2, 5], [1.0, 1.0], [*first, *second])


# ---- PhaseSampler, BackwardMarks, RegionTimer ----------------------------------------------------------------------
class FakeSplit(torch.autograd.Function):
    """Stands for a thunder split whose traces are instrumented: two fusion regions forward, one backward."""

    timer: RegionTimer | None = None

    @staticmethod
    def forward(ctx, x):
        timer = FakeSplit.timer
        timer.begin_trace("forward")
        for key in ("F0_forward", "F1_forward"):
            timer.begin_region(key)
            timer.end_region(key)
        timer.end_trace("forward")
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        timer = FakeSplit.timer
        timer.begin_trace("backward")
        timer.begin_region("B0_backward")
        timer.end_region("B0_backward")
        timer.end_trace("backward")
        return grad * 2


def sampler(clock, regions: RegionTimer | None = None, hold: DeviceHold | None = None,
            owns_hold: bool = True) -> PhaseSampler:
    piece = PhaseSampler("a piece", SampleSeries(clock), SampleSeries(clock), ReportingFailures(strict=True), hold,
                         owns_hold)
    piece.regions = regions
    return piece


def run_calls(piece: PhaseSampler, sampling: Sampling, calls: int, backward_on=lambda call: True):
    for call in range(1, calls + 1):
        x = torch.ones(3, requires_grad=True)
        args = (x,)
        out = piece.run(FakeSplit.apply, args, call) if sampling.is_sampled(call) else FakeSplit.apply(*args)
        if backward_on(call):
            out.sum().backward()


def test_a_sampler_times_forward_and_backward_of_sampled_calls_only():
    clock = CountingHostClock()
    FakeSplit.timer = RegionTimer(clock, series={})  # not attached: its marks never run
    piece = sampler(clock)
    run_calls(piece, Sampling(every=3, warmup=1), calls=8)
    piece.forward.resolve()
    piece.backward.resolve()
    # marks per sampled call: forward start, end (1 ms), backward start at the output's gradient, end (1 ms)
    assert (piece.forward.calls, piece.forward.samples_ms) == ([2, 5, 8], [1.0, 1.0, 1.0])
    assert (piece.backward.calls, piece.backward.samples_ms) == ([2, 5, 8], [1.0, 1.0, 1.0])
    assert clock.count == 3 * 4  # unsampled calls made no mark
    assert FakeSplit.timer.series == {}


def test_a_backward_that_never_ran_is_dropped_at_the_next_sampled_call():
    clock = CountingHostClock()
    FakeSplit.timer = RegionTimer(clock, series={})
    piece = sampler(clock)
    run_calls(piece, Sampling(every=3, warmup=1), calls=5, backward_on=lambda call: call != 2)
    piece.forward.resolve()
    piece.backward.resolve()
    assert piece.forward.calls == [2, 5]
    assert piece.backward.calls == [5]
    assert piece._backward_marks.window.closed  # the hooks of call 5 fired and were removed


class LaterConsumer(torch.autograd.Function):
    """Another consumer of a piece's input, whose backward runs after the piece's (and makes a mark)."""

    clock: CountingHostClock | None = None

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        LaterConsumer.clock.mark()
        return grad * 3


def test_the_backward_ends_with_the_pieces_own_nodes_not_when_its_inputs_gradients_are_complete():
    # Like a tied embedding weight: the input's gradient is complete only after another consumer's backward.
    clock = CountingHostClock()
    FakeSplit.timer = RegionTimer(clock, series={})
    LaterConsumer.clock = clock
    piece = sampler(clock)
    x = torch.ones(3, requires_grad=True)
    other = LaterConsumer.apply(x)
    out = piece.run(FakeSplit.apply, (x,), call=1)
    (out.sum() + other.sum()).backward()  # autograd runs FakeSplit's node first, the later consumer's next
    piece.backward.resolve()
    assert clock.count == 5  # forward start, end, backward start, end, the later consumer's mark
    assert piece.backward.samples_ms == [1.0]  # the later consumer's backward is not in it
    assert piece._backward_marks.window.closed


def test_region_timer_records_regions_and_outside_time_of_sampled_calls():
    clock = CountingHostClock()
    timer = RegionTimer(clock, series={})
    FakeSplit.timer = timer
    piece = sampler(clock, regions=timer)
    run_calls(piece, Sampling(every=3, warmup=1), calls=8)
    # A trace's marks are read when the next sampled trace starts: all but the last (call 8's backward).
    assert timer.pending == 1 and timer.series["B0_backward"].calls == [2, 5]
    timer.resolve()
    for series in [piece.forward, piece.backward]:
        series.resolve()
    samples = {key: (series.calls, series.samples_ms) for key, series in timer.series.items()}
    # Marks of a sampled call, 1 ms apart: split start | trace start, F0 begin, F0 end, F1 begin, F1 end, trace end |
    # split end | backward start | trace start, B0 begin, B0 end, trace end | backward end.
    assert samples == {
        "F0_forward": ([2, 5, 8], [1.0] * 3),
        "F1_forward": ([2, 5, 8], [1.0] * 3),
        "outside_forward": ([2, 5, 8], [3.0] * 3),  # trace start -> F0, F0 -> F1, F1 -> trace end
        "B0_backward": ([2, 5, 8], [1.0] * 3),
        "outside_backward": ([2, 5, 8], [2.0] * 3),
    }
    assert piece.forward.samples_ms == [7.0] * 3
    assert piece.backward.samples_ms == [5.0] * 3
    assert clock.count == 3 * 14
    assert (timer.forward_call, timer.backward_call) == (0, 0)  # disarmed after each sampled call


def test_ranges_name_every_region_on_every_call_for_the_profiler():
    timer = RegionTimer(CountingHostClock(), series={}, ranges=(Ranges(), "graph0/thunder_0"))
    FakeSplit.timer = timer
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        FakeSplit.apply(torch.ones(3, requires_grad=True)).sum().backward()  # not a sampled call
    names = [e.name for e in profile.events() if e.name.startswith("graph0/")]
    assert sorted(names) == [
        "graph0/thunder_0 backward", "graph0/thunder_0 forward", "graph0/thunder_0/B0_backward",
        "graph0/thunder_0/F0_forward", "graph0/thunder_0/F1_forward",
    ]
    assert timer.series == {}  # ranges only: no marks on an unsampled call


# ---- trace.json layout ----------------------------------------------------------------------------------------------
def test_chrome_trace_packs_each_sampled_call_without_overlaps():
    from thunderfx_debug.records import FusionRecord, GraphRecord, Phase, RankRecord, SplitKind, SplitRecord, Timing
    from thunderfx_debug.render.chrome_trace import chrome_trace

    def timing(*samples):
        return Timing(samples_ms=samples, calls=(2, 5), clock="cuda")

    thunder = SplitRecord(
        name="thunder_0", kind=SplitKind.THUNDER, timing=timing(6.0, 7.0), backward_timing=timing(9.0, 9.5),
        fusions=(FusionRecord("nvFusion0", "nvfuser", Phase.FORWARD, timing=timing(2.0, 2.5)),
                 FusionRecord("nvFusion1", "nvfuser", Phase.FORWARD, timing=timing(1.0, 1.0)),
                 FusionRecord("nvFusion0", "nvfuser", Phase.BACKWARD, timing=timing(4.0, 4.0))),
        outside_fusions_timing={"outside_forward": timing(2.5, 3.0), "outside_backward": timing(4.5, 5.0)},
    )
    inductor = SplitRecord(name="inductor_1", kind=SplitKind.INDUCTOR, timing=timing(1.0, 1.0),
                           backward_timing=timing(2.0, 2.0))
    graph = GraphRecord(name="graph0", index=0, splits=(thunder, inductor), timing=timing(7.5, 8.5),
                        backward_timing=timing(11.5, 12.0))
    events = [e for e in chrome_trace(RankRecord(graphs=(graph,)))["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 2 * (2 + 4 + 3 + 2)  # every sample once: graph, splits, fusions, outside fusions
    by_name = {(e["name"], e["args"]["call"]): e for e in events}
    for call in (2, 5):
        forward, backward = by_name[("graph0 forward", call)], by_name[("graph0 backward", call)]
        assert backward["ts"] == forward["ts"] + forward["dur"]
        split_fwd, split_bwd = by_name[("graph0/thunder_0 forward", call)], by_name[("graph0/thunder_0 backward", call)]
        assert split_fwd["ts"] == forward["ts"]
        # backward runs the splits in reverse order: inductor_1 first, then thunder_0
        assert split_bwd["ts"] == backward["ts"] + by_name[("graph0/inductor_1 backward", call)]["dur"]
        f0, f1 = by_name[("graph0/thunder_0/nvFusion0_forward", call)], by_name[("graph0/thunder_0/nvFusion1_forward", call)]
        outside = by_name[("graph0/thunder_0 outside fusions forward", call)]
        assert (f0["ts"], f1["ts"], outside["ts"]) == (split_fwd["ts"], f0["ts"] + f0["dur"], f1["ts"] + f1["dur"])
        assert outside["ts"] + outside["dur"] <= split_fwd["ts"] + split_fwd["dur"]
        assert by_name[("graph0/thunder_0/nvFusion0_backward", call)]["ts"] == split_bwd["ts"]
    tracks: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        tracks.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


# ---- a real Thunder run on CPU -------------------------------------------------------------------------------------
STEPS, EVERY, WARMUP = 8, 3, 1
SAMPLED = (2, 5, 8)


def _train(**options):
    from thunderfx_debug import ReportingBackend

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0)
    backend = ReportingBackend(executors=cpu_executors(), strict=True, **options)
    compiled = torch.compile(model, backend=backend)
    losses = train(compiled, model, config, STEPS)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return backend, compiled, model, config, losses, params


@pytest.fixture(scope="module")
def runs():
    # One CPU thread: with several, CPU kernels reduce in an order that varies from run to run, and two runs of the
    # same settings already differ in the last bits of the parameters.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        off = _train(timing="off")
        fusion = _train(timing="fusion", timing_every=EVERY, timing_warmup=WARMUP, nvtx=True)
        backend, compiled, model, config, _, _ = fusion
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            train(compiled, model, config, steps=1)  # call 9: not sampled, the ranges are there all the same
        range_names = {e.name for e in profile.events() if e.name.startswith("graph")}
        yield off, fusion, range_names
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


def test_fusion_timing_changes_no_number(runs):
    (_, _, _, _, off_losses, off_params), (_, _, _, _, losses, params), _ = runs
    assert torch.equal(off_losses, losses), (off_losses, losses)
    for name in off_params:
        assert torch.equal(off_params[name], params[name]), name


def test_every_region_of_forward_and_backward_is_timed_on_exactly_the_sampled_calls(runs):
    backend = runs[1][0]
    report = backend.report()
    thunder_splits = [s for g in report.graphs for s in g.splits if s.kind.value == "thunder"]
    assert len(thunder_splits) >= 2
    for split in thunder_splits:
        phases = {f.phase.value for f in split.fusions}
        assert phases == {"forward", "backward"}, split.name
        for fusion in split.fusions:
            assert fusion.name.startswith("TorchCompile"), fusion.name
            assert fusion.timing is not None and fusion.timing.calls == SAMPLED, (split.name, fusion.qualified_name)
            assert fusion.timing.clock == "host"
        assert sorted(split.outside_fusions_timing) == ["outside_backward", "outside_forward"]
        for phase, timing in split.outside_fusions_timing.items():
            assert timing.calls == SAMPLED, (split.name, phase)
        # The trace runs inside the split's call: its regions and the time outside them fit in the split's time.
        forward = [s for f in split.fusions_in("forward") for s in f.timing.samples_ms]
        for i, call in enumerate(SAMPLED):
            in_trace = sum(f.timing.samples_ms[i] for f in split.fusions_in("forward"))
            in_trace += split.outside_fusions_timing["outside_forward"].samples_ms[i]
            assert 0 < in_trace <= split.timing.samples_ms[i], (split.name, call)
        assert all(s > 0 for s in forward)


def without_provenance(trace: str | None) -> str | None:
    """A trace's text without its first line, which says how many milliseconds Thunder's last pass took."""
    return None if trace is None else trace.split("\n", 1)[1]


def test_the_recorded_traces_are_the_ones_thunder_built_without_timing_calls(runs):
    off_report, report = runs[0][0].report(), runs[1][0].report()
    for off_graph, graph in zip(off_report.graphs, report.graphs, strict=True):
        for off_split, split in zip(off_graph.splits, graph.splits, strict=True):
            assert without_provenance(split.fwd_trace) == without_provenance(off_split.fwd_trace), split.name
            assert without_provenance(split.bwd_trace) == without_provenance(off_split.bwd_trace), split.name
            assert [f.qualified_name for f in split.fusions] == [f.qualified_name for f in off_split.fusions]
            if split.fwd_trace is not None:
                assert "thunderfx_debug" not in split.fwd_trace + split.bwd_trace


def test_nvtx_ranges_name_the_regions_in_the_profiler(runs):
    report = runs[1][0].report()
    expected = {f"{g.name}/{s.name}/{f.qualified_name}" for g in report.graphs for s, f in g.fusions()}
    expected |= {f"{g.name}/{s.name} {phase}" for g in report.graphs for s in g.splits if s.fusions
                 for phase in ("forward", "backward")}
    assert runs[2] == expected


def test_a_mark_that_fails_drops_its_trace_is_logged_and_the_training_goes_on_unchanged(runs, monkeypatch):
    """A mark runs inside Thunder's trace, in the training's own forward and backward: where recording one raises (a
    CUDA error on a real device), that trace records nothing more, the failure is counted where the report says,
    and the training computes what it computes without any timing."""
    from thunderfx_debug import ReportingBackend

    (_, _, _, _, off_losses, off_params), _, _ = runs
    monkeypatch.setattr(HostClock, "marker", failing_every_other_trace(HostClock.marker))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch._dynamo.reset()
        model, config = tiny_gpt(seed=0)
        backend = ReportingBackend(executors=cpu_executors(), timing="fusion", timing_every=EVERY,
                                   timing_warmup=WARMUP)
        losses = train(torch.compile(model, backend=backend), model, config, STEPS)
        assert torch.equal(off_losses, losses), (off_losses, losses)
        assert all(torch.equal(off_params[name], p) for name, p in model.named_parameters())
        report = backend.report()
        failed = [f for f in report.meta["reporting_failures"] if f["what"].startswith("timing the fusion regions")]
        assert failed and all("illegal memory access" in f["error"] for f in failed), report.meta
        recorded = 0
        for split in [s for g in report.graphs for s in g.splits if s.fusions]:
            for phase in ("forward", "backward"):  # a trace records all its marks or none
                outside = split.outside_fusions_timing.get(f"outside_{phase}")
                calls = {tuple(f.timing.calls) if f.timing is not None else () for f in split.fusions_in(phase)}
                calls.add(tuple(outside.calls) if outside is not None else ())
                assert len(calls) == 1, (split.name, phase, calls)
                recorded += len(calls.pop())
        assert 0 < recorded < 2 * len(SAMPLED) * sum(1 for g in report.graphs for s in g.splits if s.fusions)
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


def run_trace(timer: RegionTimer) -> None:
    """What an instrumented forward trace with one region calls."""
    timer.begin_trace("forward")
    timer.begin_region("F0_forward")
    timer.end_region("F0_forward")
    timer.end_trace("forward")


@pytest.mark.parametrize("strict", [False, True, None])
def test_a_failed_mark_is_recorded_raised_where_strict_and_raised_without_failures(strict):
    """Where a failure goes: recorded (the trace dropped, the next sampled trace recorded again), raised in strict
    mode, and raised into the trace by a timer that was given no failures to record it in."""
    class FailingClock(CountingHostClock):
        fail = True

        def marker(self):
            def mark():
                if self.fail:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                return self.mark()
            return mark

    clock = FailingClock()
    failures = ReportingFailures(strict=bool(strict)) if strict is not None else None
    timer = RegionTimer(clock, series={}, failures=failures, label="graph0/thunder_0")
    timer.forward_call = 2
    if strict is not False:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            timer.begin_trace("forward")
        return
    run_trace(timer)
    assert [f["what"] for f in failures.failures] == ["timing the fusion regions of graph0/thunder_0"]
    clock.fail, timer.forward_call = False, 5
    run_trace(timer)
    timer.resolve(wait=True)
    assert timer.series["F0_forward"].calls == [5] and failures.total == 1


def test_the_device_hold_sleeps_before_the_first_mark_of_each_sampled_phase_and_learns_the_host_time():
    clock = CountingHostClock()
    FakeSplit.timer = RegionTimer(clock, series={})
    events = []
    host_ms = iter([0, 4, 100, 103, 200, 204, 300, 303])  # host readings of the hold, in ms: 4 ms forward, 3 backward

    class MarkLog(CountingHostClock):
        def mark(self):
            events.append("mark")
            return clock.mark()

    hold = DeviceHold(lambda cycles: events.append(cycles), cycles_per_ms=1000, counter=lambda: next(host_ms) * 10**6)
    log_clock = MarkLog()
    piece = sampler(log_clock, hold=hold)
    run_calls(piece, Sampling(every=3, warmup=1), calls=5)
    # Call 2 (first sampled): 10 ms sleeps; call 5: 1.25x the host time of call 2's forward (4 ms) and backward (3 ms).
    assert events == [10_000, "mark", "mark", 10_000, "mark", "mark", 5_000, "mark", "mark", 3_750, "mark", "mark"]


class DeviceMarks:
    """A device clock whose marks are the given times (ms), all complete."""

    kind = ClockKind.CUDA

    def __init__(self, times):
        self._times = iter(times)

    def mark(self):
        return next(self._times)

    def elapsed_ms(self, start, end, wait):
        return end - start

    def marker(self):
        return self.mark

    def offsets_ms(self, marks, wait):
        return [mark - marks[0] for mark in marks]

    def recycle(self, marks):
        pass


def test_the_device_hold_sleeps_for_the_hosts_lead_over_the_device_and_all_of_its_time_when_that_was_too_short():
    slept = []
    host_ms = iter([0, 1, 2, 6, 7, 8, 100, 101, 109, 110, 200])
    device_ms = iter([0, 10, 11, 12, 15, 16, 100, 106, 107, 108, 200, 212])
    clock = DeviceMarks(device_ms)
    hold = DeviceHold(slept.append, cycles_per_ms=1000, counter=lambda: next(host_ms) * 10**6, clock=clock)
    timer = RegionTimer(clock, series={}, hold=hold)

    def sampled_forward(call, region=True):
        hold.begin(Phase.FORWARD, call)
        timer.forward_call = call
        timer.begin_trace("forward")
        if region:
            timer.begin_region("F0_forward")
            timer.end_region("F0_forward")
        timer.end_trace("forward")
        timer.forward_call = 0
        hold.end(Phase.FORWARD)

    # Call 1 sleeps 10 ms (nothing known yet). Its spans start on the device 1, 2 and 5 ms after the sleep, after
    # the host queued their ends (2, 6 and 7 ms after it began): the host's largest lead was 6 - 2 = 4 ms.
    sampled_forward(1)
    # Call 2: 1.25 x 4 ms + 0.1 x the phase's 8 ms of host time, not 1.25 x 8 ms.
    # Its one span starts on the device 7 ms after the hold began, before the host queued its end (9 ms): the
    # sleep was too short, so call 3 sleeps 1.25x the host's 10 ms.
    sampled_forward(2, region=False)
    hold.begin(Phase.FORWARD, 3)
    assert slept == [10_000, 5_800, 12_500]
    assert hold.sleeps == {"first": [1, 10.0], "whole": [1, 12.5], "lead": [1, 5.8]}


def test_the_backwards_hold_counts_what_the_device_had_not_made_up_of_the_forward_when_the_host_began_it():
    slept = []
    host_ms = iter([0, 1, 3, 4, 5, 6, 9, 9, 100, 105])
    # The forward's sleep (10 ms) and work leave the device 20 ms into the call when the host, 5 ms in, begins the
    # backward: the device is at least 15 ms behind, which the backward's own spans need no sleep for.
    device_ms = iter([0, 10, 10, 12, 20, 30, 30, 31, 100, 105, 110, 112])
    clock = DeviceMarks(device_ms)
    hold = DeviceHold(slept.append, cycles_per_ms=1000, counter=lambda: next(host_ms) * 10**6, clock=clock)
    timer = RegionTimer(clock, series={}, hold=hold)
    hold.begin(Phase.FORWARD, 1)
    timer.forward_call = 1
    timer.begin_trace("forward"); timer.end_trace("forward")  # queued 1 and 3 ms after the forward began
    timer.forward_call = 0
    hold.end(Phase.FORWARD)
    hold.begin(Phase.BACKWARD, 1)
    timer.backward_call = 1
    timer.begin_trace("backward"); timer.end_trace("backward")  # queued 1 and 4 ms after the backward began
    hold.end(Phase.BACKWARD)
    hold.begin(Phase.FORWARD, 2)
    hold.begin(Phase.BACKWARD, 2)
    # Forward: 1.25 x its lead of 3 ms + 0.1 x its 4 ms. Backward: no lead (the device came to its span 25 ms after
    # the host began it, the host had queued it at 4 ms), so a tenth of its 4 ms, which the shortest hold (1 ms)
    # covers; not 1.25 x 4 ms, as it would be if the device were taken to be level with the host.
    assert slept == [10_000, 10_000, 4_150, 1_000]
    assert hold.sleeps["lead"] == [2, pytest.approx(4.55)]


def test_one_hold_per_phase_of_a_call_comes_before_every_mark_of_a_graph_and_its_splits():
    # In the backward, autograd runs the split's pre-hook before the graph's (the split registered its hooks first,
    # on the same output node): the hold must still come before the split's start mark, and only once.
    events = []

    class Labelled(CountingHostClock):
        def __init__(self, label):
            super().__init__()
            self.label = label

        def mark(self):
            events.append(self.label)
            return super().mark()

    FakeSplit.timer = RegionTimer(CountingHostClock(), series={})
    hold = DeviceHold(lambda cycles: events.append("hold"), cycles_per_ms=1000)
    graph_clock, split_clock = Labelled("graph"), Labelled("split")
    graph = sampler(graph_clock, hold=hold)
    split = sampler(split_clock, hold=hold, owns_hold=False)
    x = torch.ones(3, requires_grad=True)
    out = graph.run(lambda t: split.run(FakeSplit.apply, (t,), call=7), (x,), call=7)
    assert events == ["hold", "graph", "split", "split", "graph"]
    events.clear()
    out.sum().backward()
    assert events[0] == "hold" and events.count("hold") == 1
    assert sorted(events[1:]) == ["graph", "graph", "split", "split"]


class _ValueObserver:
    """An observer of a split's regions that reads the values they get and return."""

    def __init__(self):
        self.values_seen: list[tuple[str, str, int]] = []

    def begin_trace(self, phase): ...

    def begin_region(self, key, *inputs):
        self.values_seen.append(("inputs", key, len(inputs)))

    def end_region(self, key, *outputs):
        self.values_seen.append(("outputs", key, len(outputs)))

    def end_trace(self, phase): ...


class _KeyObserver(_ValueObserver):
    observes_values = False


@pytest.mark.parametrize("observer_type, with_values", [(_ValueObserver, True), (_KeyObserver, False)])
def test_the_marks_pass_region_values_only_to_an_observer_that_reads_them(observer_type, with_values):
    import thunder

    from thunderfx_debug.thunder import instrument

    observer = observer_type()
    jitted = thunder.jit(lambda x: (x * 2 + 1).sin() * 3, executors=cpu_executors())
    instrument.attach(jitted, observer)
    x = torch.randn(4)
    assert torch.allclose(jitted(x), (x * 2 + 1).sin() * 3)  # the fused region rounds as it likes
    assert observer.values_seen, "the trace has no fusion region to observe"
    assert all((count > 0) is with_values for _, _, count in observer.values_seen), observer.values_seen
