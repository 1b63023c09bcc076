"""The training path's runners (`recording.runners`) on fakes: which calls of a graph and of its splits take the
first-call, sampled and checked paths (exactly those the schedules pick, whatever the runners skip on the calls in
between), and what a failure on an ordinary call records."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from thunderfx_debug.records import FailedIn
from thunderfx_debug.recording.check import CheckSchedule, TimingBesideChecks
from thunderfx_debug.recording.host import host_series
from thunderfx_debug.recording.runners import GraphRunner, SplitRunner
from thunderfx_debug.recording.timing import NEVER, Sampling


class Recording:
    """Stands for a PhaseSampler or a FirstCallTimer: runs the piece and notes the call it was asked to time."""

    def __init__(self, state):
        self.state, self.calls = state, []

    def run(self, fn, args, call=None):
        self.calls.append(self.state.calls if call is None else call)
        return fn(*args)


class RecordingCheck:
    """Stands for a SplitCheck: notes the calls it checked."""

    def __init__(self, schedule: CheckSchedule):
        self.schedule, self.calls = schedule, []

    def before(self, call, args):
        self.calls.append(call)
        return call

    def after(self, checked, args, out):
        pass

    def abandon(self, checked):
        pass


def _graph_of_one_split(sampling, check_every: int | None, inner=lambda x: x + 1, on_error=None):
    graph = SimpleNamespace(calls=0, name="graph0", failed_split=None, period=host_series())  # a GraphState's
    split = SimpleNamespace(calls=0, name="thunder_0", error=None, failure=None)
    split_sampler, split_first = Recording(graph), Recording(graph)
    runner = SplitRunner(inner, split, graph, sampling, split_sampler, capture=None, first=split_first)
    if check_every is not None:
        runner.check = RecordingCheck(CheckSchedule(check_every))
    graph_sampler, graph_first = Recording(graph), Recording(graph)
    on_error = on_error or (lambda state, error, args: (_ for _ in ()).throw(error))
    graph_runner = GraphRunner(graph, lambda x: runner(x), sampling, graph_sampler, None, on_error, first=graph_first)
    return SimpleNamespace(graph=graph, split=split, runner=runner, graph_runner=graph_runner,
                           graph_sampler=graph_sampler, graph_first=graph_first, split_sampler=split_sampler,
                           split_first=split_first)


@pytest.mark.parametrize("every, warmup, check_every", [(50, 5, None), (3, 1, None), (1, 0, None), (5, 0, 5),
                                                        (50, 5, 50), (4, 2, 3), (2, 0, 1)])
def test_graph_and_split_take_the_sampled_checked_and_first_paths_on_exactly_the_scheduled_calls(
        every, warmup, check_every):
    sampling = Sampling(every, warmup)
    if check_every is not None:
        sampling = TimingBesideChecks(sampling, CheckSchedule(check_every))
    pieces = _graph_of_one_split(sampling, check_every)
    calls = 160
    for call in range(1, calls + 1):
        assert pieces.graph_runner(call) == call + 1
    sampled = [c for c in range(2, calls + 1) if sampling.is_sampled(c)]  # call 1 is the first call's
    checked = [c for c in range(1, calls + 1) if check_every and CheckSchedule(check_every).is_checked(c)]
    assert pieces.graph.calls == pieces.split.calls == calls
    assert pieces.graph_first.calls == pieces.split_first.calls == [1]
    assert pieces.graph_sampler.calls == ([1] if sampling.is_sampled(1) else []) + sampled
    assert pieces.split_sampler.calls == pieces.graph_sampler.calls
    assert (pieces.runner.check.calls if check_every else []) == checked
    # each sampled call's period is closed by the call after it
    assert pieces.graph.period.stream.count == len([c for c in pieces.graph_sampler.calls if c < calls])


def test_a_split_failing_on_an_ordinary_call_is_named_and_the_graph_falls_back():
    def inner(x):
        if x == 7:
            raise RuntimeError("Thunder failed at call 7")
        return x + 1

    errors = []

    def on_error(state, error, args):
        errors.append((state.calls, str(error)))
        return lambda x: -x  # what runs the graph from now on

    pieces = _graph_of_one_split(Sampling(50, 5), None, inner=inner, on_error=on_error)
    results = [pieces.graph_runner(call) for call in range(1, 11)]
    assert results == [2, 3, 4, 5, 6, 7, -7, -8, -9, -10]
    assert errors == [(7, "Thunder failed at call 7")]
    assert pieces.split.calls == 7  # the fallback runs the graph without its splits
    assert pieces.split.error is not None and "call 7" in pieces.split.error
    assert pieces.graph.failed_split == "thunder_0"
    assert (pieces.split.failure.failed_in, pieces.split.failure.call) == (FailedIn.FORWARD, 7)
    assert pieces.graph_sampler.calls == [6]


def test_without_a_fallback_the_error_of_an_ordinary_call_propagates_and_later_calls_run_again():
    def inner(x):
        if x == 3:
            raise ValueError("bad input")
        return x + 1

    pieces = _graph_of_one_split(Sampling(50, 5), None, inner=inner)
    assert [pieces.graph_runner(c) for c in (1, 2)] == [2, 3]
    with pytest.raises(ValueError, match="bad input"):
        pieces.graph_runner(3)
    assert pieces.graph.failed_split == "thunder_0"
    assert [pieces.graph_runner(c) for c in (4, 5, 6)] == [5, 6, 7]
    assert pieces.graph_sampler.calls == [6]


@pytest.mark.parametrize("every, warmup, enabled", itertools.product((1, 2, 3, 50), (0, 1, 5), (True, False)))
def test_next_sampled_and_next_checked_are_the_first_calls_the_schedules_pick(every, warmup, enabled):
    def first_after(after, picks):
        return next((call for call in range(after + 1, after + 500) if picks(call)), NEVER)

    sampling = Sampling(every, warmup, enabled)
    for after in range(0, 200):
        assert sampling.next_sampled(after) == first_after(after, sampling.is_sampled)
    for check_every in (1, 2, 3, 50):
        schedule = CheckSchedule(check_every)
        both = TimingBesideChecks(sampling, schedule)
        for after in range(0, 200):
            assert schedule.next_checked(after) == first_after(after, schedule.is_checked)
            assert both.next_sampled(after) == first_after(after, both.is_sampled), (check_every, after)
