"""What runs on the training path: the callable the backend hands Dynamo for each graph, and the stand-in of each
split inside it.

Each runner keeps the number of the next call on which it has more to do than run its piece (its first call, a
sampled or checked call, the call that ends a sampled call's period: `_special_call_after`); the calls before it pay
a counter and one comparison (a split also its one Python call), and with a dump directory one clock reading per
graph call for the periodic flush (`periodic`). On the call after a sampled one, a graph reads the clock (the end of
its call period); with THUNDERFX_DEBUG_TIMING_SHARE below 100 also on the call before it (an ordinary call's period,
against which a timed call's is charged: `sampler.TimedCalls`), and with THUNDERFX_DEBUG_CHECK_SHARE below 100 on a
checked call, the call after it and the call before it (`check.CheckedCalls`). Sampled calls add clock marks before
and after, and gradient hooks that mark the start and end of the backward (see `sampler`). The first call of a graph
and of each split is timed on the host clock, forward and backward, for its compile cost
(`compile_cost.FirstCallTimer`), and keeps host copies of its inputs and outputs when the run asks for real inputs
(`capture`). With the correctness sentinel on, a checked call of a thunder split
also runs its check after it (`split_check`), outside the split's first-call timing (a graph's
first call, which is always checked, includes it). Some sampled calls (`memory.measures`: the first two, then ever
rarer) also measure what each piece holds in memory (`memory`: saved-tensor hooks around the forward, windows on the
allocator's history on CUDA), outside the timing marks, at every timing level from `graph` on; the graph's call
after a sampled one closes the backward windows that never ended. After its first, sampled and checked calls, a
thunder split's backward functions are watched (`BackwardWatch`), so that one that raises in autograd's engine is
recorded as the split's; a failure of a call records that call's inputs (`fallback`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from thunderfx_debug.recording.memory import measures as memory_measures
from thunderfx_debug.recording.sampler import PhaseSampler, TimedCalls
from thunderfx_debug.recording.timing import NEVER, RegionTimer, SampleSeries, Sampling
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.settings.safety import ReportingFailures, describe_exception
from thunderfx_debug.records import FailedIn
from thunderfx_debug.recording.recorder import PieceFailure
from thunderfx_debug.thunder import compile_events
from thunderfx_debug.thunder.failures import watch_backward

if TYPE_CHECKING:
    from thunderfx_debug.recording.capture import InputCapture
    from thunderfx_debug.recording.check import CheckedCalls
    from thunderfx_debug.recording.compile_cost import FirstCallTimer
    from thunderfx_debug.recording.memory import GraphMemory, MemoryMeter
    from thunderfx_debug.recording.periodic import PeriodicFlush
    from thunderfx_debug.recording.recorder import GraphState, SplitState
    from thunderfx_debug.recording.split_check import SplitCheck


def _measures_memory(meter: object | None, sampling: Sampling, call: int) -> bool:
    """Whether sampled call `call` measures memory (`memory.measures`: not every sampled call does)."""
    return meter is not None and memory_measures(sampling.index(call))


class GraphErrorHandler(Protocol):
    def __call__(self, state: GraphState, error: BaseException, args: tuple) -> Callable:
        """Records that Thunder failed on a graph, then raises `error` again or returns what runs the graph from
        now on (THUNDERFX_DEBUG_ON_ERROR)."""

    def backward_failed(self, state: GraphState, error: BaseException) -> bool:
        """Records that the backward of a piece of the graph raised `error` (which goes on to the training); True
        where the graph runs without Thunder from its next call (THUNDERFX_DEBUG_ON_ERROR=fallback)."""

    def write(self, state: GraphState) -> None:
        """Writes the dump with the failure recorded (a backward's, which is not written from autograd's engine)."""

    def fallback(self, state: GraphState, args: tuple) -> Callable:
        """What runs the graph from now on, without Thunder."""


class BackwardWatch:
    """Tells of a thunder split's backward that raises: it raises inside autograd's engine, after the split's call
    returned, where the split's runner cannot see it. After each of the split's first, sampled and checked calls
    (`after_call`), the backward functions of Thunder's cache entries for it, and that of the call just made, are
    watched (`thunder.failures.watch_backward`); an entry Thunder makes for other inputs at an ordinary call is
    watched from the split's next such call. A failure is noted (`failed`) and goes on to the training as it was."""

    def __init__(self, compiled, failures: ReportingFailures, label: str,
                 failed: Callable[[BaseException], None]):
        self.compiled, self.failures, self.label, self._failed = compiled, failures, label, failed

    def after_call(self, outputs) -> None:
        with self.failures.guard(f"watching the backward of {self.label}"):
            watch_backward(self.compiled, outputs, self.failed)

    def failed(self, error: BaseException) -> None:
        """Called by the backward function that raised (in autograd's engine), before its exception goes on."""
        with self.failures.guard(f"recording the failure of the backward of {self.label}"):
            self._failed(error)


class ThunderOverhead:
    """After a sampled call of a thunder split: the host time Thunder spent in the call outside its computation
    function (cache check, prologue, autograd connection, epilogue), from the split's compile stats, into `series`."""

    def __init__(self, module, series: SampleSeries, failures: ReportingFailures, label: str):
        self.module, self.series, self.failures, self.label = module, series, failures, label

    def read(self, call: int) -> None:
        with self.failures.guard(f"reading Thunder's host time in {self.label}"):
            ns = compile_events.overhead_ns(self.module)
            if ns is not None:
                self.series.add_measured(call, ns / 1e6)


class SplitRunner(torch.nn.Module):
    """Stands in for a thunder_N / inductor_N submodule of the split graph: counts calls, times sampled ones, keeps
    the first call's inputs and outputs (with `capture`), and notes a failure of the split before it propagates (so
    the report can say which split failed).

    An nn.Module because the split graph holds its splits as submodules, with the split itself as its child `inner`.
    It is called directly (`__call__` is `forward`) and reaches the split through an instance attribute, because
    the split graph calls it on every step, and nn.Module's hook dispatch and submodule lookup cost about a
    microsecond a call.
    """

    def __init__(self, inner: Callable, split: SplitState, graph: GraphState, sampling: Sampling,
                 sampler: PhaseSampler | None, capture: InputCapture | None, first: FirstCallTimer | None = None,
                 overhead: ThunderOverhead | None = None, memory: MemoryMeter | None = None):
        super().__init__()
        self.inner = inner
        self.__dict__["_inner"] = inner  # beside the registered child: a plain lookup on the call path
        self._split, self._graph = split, graph
        self._sampling, self._sampler, self._capture = sampling, sampler, capture
        self._first, self._overhead = first, overhead
        self._memory = memory
        self.check: SplitCheck | None = None  # the correctness sentinel's check of a thunder split (`split_check`)
        self.backward_watch: BackwardWatch | None = None  # where a thunder split's backward raises (`BackwardWatch`)
        # Told of a failure of the split's backward (the graph's runner: `GraphRunner.backward_failed`).
        self.on_backward_failure: Callable[[BaseException], None] | None = None
        # The graph call from which this split has more to do than run: 0 until its first call has run, then its
        # next sampled or checked call (`_special_call_after`). Kept in the instance dict: read on every call, and
        # written without nn.Module's __setattr__.
        self.__dict__["next_special_call"] = 0

    def attach_regions(self, regions: RegionTimer) -> None:
        """Times the fusion regions of this (thunder) split on its sampled calls; needs split-level timing."""
        if self._sampler is None:
            raise ValueError(f"{self._split.name} is not timed, so its fusion regions cannot be: fusion-level timing "
                             "needs split-level timing")
        self._sampler.regions = regions

    def forward(self, *args):
        split = self._split
        split.calls += 1
        if self._graph.calls < self.next_special_call:  # neither first, sampled nor checked: only the split runs
            try:
                return self._inner(*args)
            except Exception as e:
                self._failed(e, args)
                raise
        try:
            out = self._run_special(args)
        finally:
            self.__dict__["next_special_call"] = self._special_call_after(self._graph.calls)
        if self.backward_watch is not None:
            self.backward_watch.after_call(out)
        return out

    __call__ = forward

    def _run_special(self, args):
        check = self.check
        if check is not None and check.schedule.is_checked(self._graph.calls):
            return self._checked_call(check, args)
        if self._split.calls == 1:
            return self._first_call(args)
        return self._call(*args)

    def _special_call_after(self, call: int) -> int:
        """The first graph call after `call` that this split samples or checks."""
        sampled = (self._sampling.next_sampled(call) if self._sampler is not None or self._memory is not None
                   else NEVER)
        check = self.check
        return sampled if check is None else min(sampled, check.schedule.next_checked(call))

    def _failed(self, error: BaseException, args) -> None:
        """Notes which split failed and at which call, with that call's inputs where it is not the first (whose
        inputs are kept already), before the exception goes on (the report names it, its scripts reproduce it)."""
        self._note_failure(error, FailedIn.FORWARD, args)

    def backward_failed(self, error: BaseException) -> None:
        """The split's backward raised `error` (see `BackwardWatch`): noted as `_failed` notes a forward's, for the
        latest call (the one whose backward runs, in a training step), then the graph's runner is told."""
        self._note_failure(error, FailedIn.BACKWARD, None)
        if self.on_backward_failure is not None:
            self.on_backward_failure(error)

    def _note_failure(self, error: BaseException, failed_in: FailedIn, args) -> None:
        """The split's error and, the first time, where it raised (`args`: a forward's inputs, captured where the
        call is not the first; None for a backward, whose incoming gradients are not kept)."""
        split = self._split
        split.error = describe_exception(error)
        self._graph.failed_split = split.name
        if split.failure is None:
            captured = None
            if args is not None and split.calls > 1 and self._capture is not None:
                captured = self._capture.call(PieceKey.of(self._graph.name, split.name), args)
            split.failure = PieceFailure(failed_in, split.calls, captured)

    def _checked_call(self, check: SplitCheck, args):
        checked = check.before(self._graph.calls, args)
        try:
            out = self._first_call(args) if self._split.calls == 1 else self._call(*args)
        except Exception:
            if checked is not None:
                check.abandon(checked)
            raise
        if checked is not None:
            check.after(checked, args, out)
        return out

    def _call(self, *args):
        graph = self._graph
        try:
            if (self._sampler is not None or self._memory is not None) and self._sampling.is_sampled(graph.calls):
                out = (self._sample(*args) if not _measures_memory(self._memory, self._sampling, graph.calls)
                       else self._memory.run(self._sample, args, graph.calls))
            else:
                out = self._inner(*args)
        except Exception as e:
            self._failed(e, args)
            raise
        return out

    def _sample(self, *args):
        """A sampled call inside the memory meter's bounds: timed where the split is."""
        if self._sampler is None:
            return self._inner(*args)
        calls = self._graph.calls
        out = self._sampler.run(self._inner, args, calls)
        # The first call's is its compile; a call passed over (THUNDERFX_DEBUG_TIMING_SHARE) is not timed at all.
        if self._overhead is not None and self._split.calls > 1 and self._sampler.times(calls):
            self._overhead.read(calls)
        return out

    def _first_call(self, args):
        if self._capture is not None:
            self._capture.inputs(self._split, args)
        out = self._first.run(self._call, args) if self._first is not None else self._call(*args)
        if self._capture is not None:
            self._capture.outputs(self._split, out)
            self._capture.gradients(self._split, out)
        return out


class GraphRunner:
    """The callable returned to Dynamo for one graph: counts calls, times sampled ones, keeps the first call's
    inputs and outputs (with `capture`), runs `after_first_call(state)` once the first call has returned, hands
    a failure to `on_error`, whose answer runs the graph from then on, and after each call starts the periodic
    flush when it is due (`periodic`; None: no periodic flushes). `first` times the first call on the host clock
    (compile cost); a sampled call's period runs from its start to the start of the next call (`GraphState.period`).
    With `timed` (THUNDERFX_DEBUG_TIMING_SHARE below 100), each sampled call first asks whether it is timed, and its
    period, with that of the call before it (an ordinary call's), tells `timed` what timing it cost; with `checked`
    (THUNDERFX_DEBUG_CHECK_SHARE below 100) a checked call's period does the same for the splits' checks.
    """

    def __init__(self, state: GraphState, split_gm: torch.fx.GraphModule, sampling: Sampling,
                 sampler: PhaseSampler | None, capture: InputCapture | None, on_error: GraphErrorHandler,
                 after_first_call: Callable[[GraphState], None] | None = None,
                 periodic: PeriodicFlush | None = None, first: FirstCallTimer | None = None,
                 memory: GraphMemory | None = None, timed: TimedCalls | None = None,
                 checked: CheckedCalls | None = None):
        self.state, self.split_gm = state, split_gm
        self._timed, self._checked = timed, checked
        # what an ordinary call's period is told to (shared by `timed` and `checked`); None: neither
        self._periods = timed.periods if timed is not None else checked.periods if checked is not None else None
        self._ordinary_start: tuple[int, int] | None = None  # (call, perf_counter_ns at its start), with `_periods`
        self._checked_start: tuple[int, int] | None = None  # (checked call, perf_counter_ns at its start)
        self._memory = memory
        self._sampling, self._sampler, self._capture = sampling, sampler, capture
        self._on_error = on_error
        self._fallback: Callable | None = None
        self._after_first_call = after_first_call
        self._periodic = periodic
        self._first = first
        # (sampled call, perf_counter_ns at its start) until the next call closes its period (`GraphState.period`)
        self._period_start: tuple[int, int] | None = None
        # The call from which this graph has more to do than run its split graph: its first call, then the next
        # sampled call, the call after a sampled one, and every call once it falls back (`_special_call_after`).
        self._next_special_call = 0
        self._fall_back_next = False  # a backward of the graph raised, and the graph falls back from its next call
        self._write_failure = False  # a backward of the graph raised: its next call writes the dump first

    def __call__(self, *args):
        state = self.state
        state.calls += 1
        if state.calls < self._next_special_call:  # neither first nor sampled: the split graph alone
            try:
                out = self.split_gm(*args)
            except Exception as e:
                out = self._failed(e, args)
        else:
            out = self._run_special(args)
        periodic = self._periodic
        if periodic is not None and periodic.clock() >= periodic.due_at:
            self._period_start = self._checked_start = None  # a period with a flush in it is not a step's
            periodic.fire()  # between two graph calls of the training thread (see `periodic`)
        return out

    def _run_special(self, args):
        state = self.state
        try:
            if self._memory is not None:  # the last sampled call's backward windows that never ended
                self._memory.finish()
            if self._period_start is not None:
                call, started = self._period_start
                period_ms = (time.perf_counter_ns() - started) / 1e6
                state.period.add_measured(call, period_ms)
                self._period_start = None
                if self._timed is not None:
                    self._timed.charge(call, period_ms)
            if self._checked_start is not None:
                call, started = self._checked_start
                self._checked.charge(call, (time.perf_counter_ns() - started) / 1e6)
                self._checked_start = None
            if self._periods is not None:
                self._measure_ordinary_period(state.calls)
            if self._write_failure:
                self._write_failure = False
                self._on_error.write(state)
            if self._fall_back_next and self._fallback is None:
                self._fallback = self._on_error.fallback(state, args)
            if self._fallback is not None:
                return self._fallback(*args)
            if state.calls == 1:
                return self._first_call(args)
            return self._call(*args)
        finally:
            self._next_special_call = self._special_call_after(state.calls)

    def _special_call_after(self, call: int) -> int:
        """The first call after `call` that has more to do than run the split graph (0: every call)."""
        if self._fallback is not None:
            return 0
        if self._period_start is not None or self._checked_start is not None:
            return call + 1
        following = (self._sampling.next_sampled(call) if self._sampler is not None or self._memory is not None
                     else NEVER)
        if self._timed is not None and call < following - 1 < NEVER:
            following -= 1  # its start opens an ordinary call's period, which the sampled call's start ends
        if self._checked is not None:
            checked = self._checked.next_checked(call)
            following = min(following, checked - 1 if checked - 1 > call else checked)  # as for a timed call
        return following

    def _measure_ordinary_period(self, call: int) -> None:
        """With `timed` or `checked`: the period of the call before this one where that call was an ordinary one (not
        sampled, not checked, not the first, whose period holds the compile), and this call's start where it is one
        too."""
        now = time.perf_counter_ns()
        if self._ordinary_start is not None and self._ordinary_start[0] == call - 1:
            self._periods.add((now - self._ordinary_start[1]) / 1e6)
        ordinary = (call > 1 and not self._sampling.is_sampled(call)
                    and (self._checked is None or not self._checked.is_checked(call)))
        self._ordinary_start = (call, now) if ordinary else None

    def _failed(self, error: Exception, args):
        """Thunder failed on this graph: `on_error` records it and raises again, or falls back (see `fallback`)."""
        self._fallback = self._on_error(self.state, error, args)
        self._next_special_call = 0
        return self._fallback(*args)

    def backward_failed(self, error: BaseException) -> None:
        """The backward of one of the graph's splits raised `error` (which goes on to the training): `on_error`
        records it; the graph's next call writes the dump first (the flush at exit does where the training ends
        there), and where it falls back, runs without Thunder."""
        self._fall_back_next = self._on_error.backward_failed(self.state, error)
        self._write_failure = True
        self._next_special_call = 0

    def _call(self, *args):
        state = self.state
        try:
            if (self._sampler is not None or self._memory is not None) and self._sampling.is_sampled(state.calls):
                self._period_start = (state.calls, time.perf_counter_ns())
                if self._timed is not None:
                    self._timed.decide(state.calls)
                out = (self._sample(*args) if not _measures_memory(self._memory, self._sampling, state.calls)
                       else self._memory.graph.run(self._sample, args, state.calls))
            else:
                if self._checked is not None and state.calls > 1 and self._checked.is_checked(state.calls):
                    self._checked_start = (state.calls, time.perf_counter_ns())
                out = self.split_gm(*args)
        except Exception as e:
            return self._failed(e, args)
        return out

    def _sample(self, *args):
        """A sampled call inside the memory meter's bounds: timed where the graph is."""
        if self._sampler is None:
            return self.split_gm(*args)
        return self._sampler.run(self.split_gm, args, self.state.calls)

    def _first_call(self, args):
        state = self.state
        if self._capture is not None:
            self._capture.inputs(state, args)
        out = self._first.run(self._call, args) if self._first is not None else self._call(*args)
        if self._fallback is None:
            if self._capture is not None:
                self._capture.outputs(state, out)
            if self._after_first_call is not None:
                self._after_first_call(state)
        return out
