"""Timing one sampled call of a graph or a split: clock marks around its forward, and gradient hooks that mark the
start and end of its backward. Marks are read later (see `timing`); nothing here waits for the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import Phase
from thunderfx_debug.recording.backward_window import BackwardWindow
from thunderfx_debug.recording.host import HostWatch
from thunderfx_debug.recording.timing import DeviceHold, RegionTimer, SampleSeries
from thunderfx_debug.recording.turns import OrdinaryPeriods, Turn
from thunderfx_debug.settings.safety import ReportingFailures


class TimedCalls:
    """Which of a graph's sampled calls its samplers (the graph's and its splits') time, where
    THUNDERFX_DEBUG_TIMING_SHARE keeps timing within a share of the training's wall time: one turn per graph
    (`turns.Turns`). The graph's runner asks at each sampled call (`decide`), before any sampler runs; on a call it
    passes over, the samplers run their pieces untimed.

    What a timed call cost is charged to the turn once known (`charge`, at the graph's next call): its period (the
    host's wall time from its start to the graph's next call) less an ordinary call's (`ordinary`: the median of
    the last few periods of calls that were not timed), plus the sleeps the device hold asked for it. The period
    holds the host's work on the call's marks and hooks, and the device's lateness where the step waits for the
    device (a loss read each step); the sleeps count again for a step that never waits: a bound from above, so
    that timing takes at most about its share. A timed call whose period was not read (a periodic flush ran after
    it) is charged what the last one cost. A graph's first timed call is not charged: on CPU a tiny GPT's first
    fusion-timed call took 470 ms against 4 for an ordinary call, once.

    Example (a 10 % share on a host counter in ms; each call lasts 10 ms, a timed one 60: its cost is 50 ms, so
    after the first timed call, which is not charged, the graph comes round once per 500 ms of training, the timed
    call's own included: every 45 calls):
        >>> from thunderfx_debug.recording.turns import Turns
        >>> now = [0]
        >>> timed = TimedCalls(Turns(10.0, counter=lambda: now[0] * 10**6).join())
        >>> taken = []
        >>> for call in range(1, 201):
        ...     if call % 5 == 0:  # sampled every 5 calls
        ...         taken.append(call) if timed.decide(call) else None
        ...     lasts = 60 if timed.times(call) else 10
        ...     timed.ordinary(10) if lasts == 10 else timed.charge(call, lasts)
        ...     now[0] += lasts
        >>> taken, timed.passed_over
        ([5, 10, 55, 100, 145, 190], 34)
    """

    def __init__(self, turn: Turn, hold: DeviceHold | None = None, periods: OrdinaryPeriods | None = None):
        self.turn, self.hold = turn, hold
        self.periods = periods if periods is not None else OrdinaryPeriods()  # shared with `check.CheckedCalls`
        self.call = 0  # the timed call whose cost is not charged yet; 0: none
        self._slept_ms_before = 0.0
        self._first = True  # the graph's first timed call, which is not charged

    @property
    def passed_over(self) -> int:
        return self.turn.passed_over

    def times(self, call: int) -> bool:
        return self.call == call

    def decide(self, call: int) -> bool:
        """Whether sampled call `call` is timed; asked once per call, before the graph's sampler runs."""
        if self.call:  # the last timed call's period was not read: what the one before cost, again
            self.turn.charge(self.turn.cost_ns)
        taken = self.turn.take(call)
        self.call = call if taken else 0
        if taken:
            self._slept_ms_before = self._slept_ms()
        return taken

    def ordinary(self, period_ms: float) -> None:
        """The period of a call that was not timed."""
        self.periods.add(period_ms)

    def charge(self, call: int, period_ms: float) -> None:
        """Sampled call `call` lasted `period_ms` (host wall time, to the graph's next call). Before any ordinary
        call's period is known (every call sampled), the whole period counts: the calls passed over then tell what
        an ordinary one costs."""
        if self.call != call:
            self.ordinary(period_ms)
            return
        self.call = 0
        if self._first:  # once per graph (the instrumented traces' first runs): no measure of the calls after
            self._first = False
            return
        excess = self.periods.excess_ms(period_ms)
        excess = period_ms if excess is None else excess
        self.turn.charge((excess + self._slept_ms() - self._slept_ms_before) * 1e6)

    def _slept_ms(self) -> float:
        return sum(ms for _, ms in self.hold.sleeps.values()) if self.hold is not None else 0.0


class PhaseSampler:
    """The sampling state of one graph or split: its forward and backward sample series and the pending backward
    hooks of its last sampled call.

    `regions` is the RegionTimer of a thunder split timed at fusion level (see `thunder.instrument`): it is armed
    with the call number around the forward of each sampled call, and for that call's backward by `BackwardMarks`.

    `hold` (a graph timed at fusion level on CUDA) holds the device back before the first mark of each sampled
    forward and backward, so that its marks and those of the splits and regions inside time device work. The graph
    owns it (`owns_hold`); its splits share it so that a split's backward start, which autograd may run before the
    graph's, also comes after the hold.

    `watch` takes the host's readings of the same calls (wall time beside device time, disturbances; see
    `host.HostWatch`), outside the clock's marks: its readings are not inside what the marks time.

    `timed` (THUNDERFX_DEBUG_TIMING_SHARE below 100), shared by a graph's samplers, says which sampled calls are
    timed: on the others the piece runs as on an unsampled call.

    The bookkeeping around the piece's own function is guarded by `failures`: a failing clock or hook loses that
    sample (logged once), while the function itself runs exactly once and its exceptions are the user's, raised as
    they are.
    """

    def __init__(self, label: str, forward: SampleSeries, backward: SampleSeries, failures: ReportingFailures,
                 hold: DeviceHold | None = None, owns_hold: bool = True, watch: HostWatch | None = None,
                 timed: TimedCalls | None = None):
        self.label = label
        self.forward, self.backward = forward, backward
        self.failures = failures
        self.hold, self.owns_hold = hold, owns_hold
        self.watch = watch
        self.timed = timed
        self.regions: RegionTimer | None = None
        self._backward_marks: BackwardMarks | None = None

    def times(self, call: int) -> bool:
        """Whether sampled call `call` is timed (every one, unless THUNDERFX_DEBUG_TIMING_SHARE passes it over)."""
        return self.timed is None or self.timed.times(call)

    def run(self, fn: Callable, args: Sequence[Any], call: int) -> Any:
        """`fn(*args)` as sampled call number `call` (1-based, the graph's call count)."""
        if self.timed is not None and not self.timed.times(call):
            return fn(*args)
        regions = self.regions
        start = host = None
        with self.failures.guard(f"starting a timing sample of {self.label}"):
            if self._backward_marks is not None:  # the previous sample's backward never ran (e.g. an eval step)
                self._backward_marks.cancel()
                self._backward_marks = None
            # Reading earlier samples whose events are complete costs no synchronisation (`Event.query`).
            self.forward.resolve()
            self.backward.resolve()
            if regions is not None:
                regions.forward_call = call
            if self.hold is not None and self.owns_hold:
                self.hold.begin(Phase.FORWARD, call)
            if self.watch is not None:
                host = self.watch.begin()
            start = self.forward.clock.mark()
        try:
            out = fn(*args)
        finally:
            if regions is not None:
                regions.forward_call = 0
        with self.failures.guard(f"ending a timing sample of {self.label}"):
            if start is not None:
                self.forward.add(call, start, self.forward.clock.mark())
                if host is not None:
                    self.watch.end(host, call, Phase.FORWARD)
                if self.hold is not None and self.owns_hold:
                    self.hold.end(Phase.FORWARD)
            tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self._backward_marks = BackwardMarks(self, call, args, tensors)
        return out


class BackwardMarks:
    """Marks the backward of one sampled call of a piece (graph or split) on the clock: start just before the first
    of the piece's own autograd nodes runs, end once every node that passes gradients to its inputs has run (the
    piece's `backward_window.BackwardWindow`, closed at the end or by `cancel()`).

    The start also arms the sampler's `regions` (fusion-level timing of a thunder split) for this call's backward,
    so that its instrumented backward trace records the fusion regions of exactly this call; the window's close
    disarms it. With the sampler's `hold`, the start first holds the device back (once per call, whichever piece
    starts first), and where the sampler owns the hold the end tells it how long the host took.

    The marks are made inside the user's `backward()`: a failure goes to the sampler's failures (logged, never
    raised into the backward unless strict)."""

    def __init__(self, sampler: PhaseSampler, call: int, inputs: Sequence[Any], outputs: Sequence[torch.Tensor]):
        self.sampler, self.call = sampler, call
        self.start = self.host = None
        self.window = BackwardWindow.around(inputs, outputs, on_start=self._on_start, on_end=self._on_end,
                                            on_close=self._disarm_regions)

    def _on_start(self) -> None:
        sampler = self.sampler
        with sampler.failures.guard(f"marking the start of the backward of {sampler.label}"):
            if sampler.hold is not None:
                sampler.hold.begin(Phase.BACKWARD, self.call)
            if sampler.watch is not None:
                self.host = sampler.watch.begin()
            self.start = sampler.backward.clock.mark()
            if sampler.regions is not None:
                sampler.regions.backward_call = self.call

    def _on_end(self) -> None:
        sampler = self.sampler
        with sampler.failures.guard(f"marking the end of the backward of {sampler.label}"):
            if self.start is not None:
                sampler.backward.add(self.call, self.start, sampler.backward.clock.mark())
                if self.host is not None:
                    sampler.watch.end(self.host, self.call, Phase.BACKWARD)
                if sampler.hold is not None and sampler.owns_hold:
                    sampler.hold.end(Phase.BACKWARD)

    def _disarm_regions(self) -> None:
        regions = self.sampler.regions
        if regions is not None and regions.backward_call == self.call:
            regions.disarm_backward()

    def cancel(self) -> None:
        if self.window is not None:
            self.window.close()
