"""The host's side of a sampled call: its wall time (perf_counter) beside the device time the clock measures, and
whether something disturbed it (the process compiled during the call, or the thread waited for a CPU).

`HostWatch.begin()` before a phase of a sampled call and `HostWatch.end(...)` after it cost two perf_counter readings,
plus, for a graph, a read of Dynamo's compile counter and of the thread's run-queue wait (`run_queue_wait_ns`,
about 5-15 µs on Linux, nothing elsewhere). Only sampled calls pay.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from collections.abc import Callable

from thunderfx_debug.records import Disturbance, DisturbedCall, Phase
from thunderfx_debug.recording.samples import SampleStream
from thunderfx_debug.recording.timing import HostClock, SampleSeries

#: A call whose thread waited for a CPU for more than this share of its wall time, and more than PREEMPTED_FACTOR times
#: the share its graph's sampled calls typically waited, was preempted: the machine's other work slowed it more than
#: the others (on a machine loaded evenly, every call waits alike and none is singled out).
PREEMPTED_SHARE = 0.10
PREEMPTED_FACTOR = 2.0



def host_series() -> SampleSeries:
    """A host-clock series for the host's side of sampled calls (wall time, call periods, Thunder's own time): they
    stand beside the pieces' own timings, so they keep fewer samples raw than those (the first 2, a uniform sample
    of 48, the last 8) and a short time series (8 to 16 windows)."""
    return SampleSeries(HostClock(), SampleStream(first=2, reservoir=48, recent=8, max_windows=16, window_values=8))


_SCHEDSTAT = "/proc/thread-self/schedstat"
_schedstat_readable = sys.platform.startswith("linux") and os.path.exists(_SCHEDSTAT)


def run_queue_wait_ns() -> int | None:
    """Nanoseconds this thread has waited on a run queue so far (Linux schedstat, second field); None elsewhere."""
    global _schedstat_readable
    if not _schedstat_readable:
        return None
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)  # /proc/thread-self: opened anew, for the thread reading it now
        try:
            return int(os.read(fd, 128).split()[1])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        _schedstat_readable = False
        return None


class CallWaits:
    """The disturbed sampled calls of a graph (the rules of `records.Disturbance`), decided as each phase of a call
    ends and kept in bounded memory: a run of any length keeps the `MAX_KEPT` most recent.

    A phase is preempted when its run-queue wait is more than PREEMPTED_SHARE of its wall time and more than
    PREEMPTED_FACTOR times the median share of the phase's last RECENT sampled calls (this one included).
    """

    RECENT = 64
    MAX_KEPT = 256

    def __init__(self):
        self._recent: dict[Phase, collections.deque[float]] = {
            phase: collections.deque(maxlen=self.RECENT) for phase in Phase}
        self._disturbed: dict[int, Disturbance] = {}

    def add(self, call: int, phase: Phase, wall_ns: int, wait_ns: int | None, compiled: bool) -> None:
        if compiled:
            self._mark(call, Disturbance.COMPILE)
        if wait_ns is None or wall_ns <= 0:
            return
        share = wait_ns / wall_ns
        recent = self._recent[phase]
        recent.append(share)
        if share > PREEMPTED_SHARE and share > PREEMPTED_FACTOR * statistics.median(recent):
            self._mark(call, Disturbance.PREEMPTED)

    def _mark(self, call: int, why: Disturbance) -> None:
        if self._disturbed.get(call) is Disturbance.COMPILE:
            return  # the stronger reason stays
        self._disturbed.pop(call, None)
        self._disturbed[call] = why
        if len(self._disturbed) > self.MAX_KEPT:
            del self._disturbed[next(iter(self._disturbed))]

    def disturbed(self) -> tuple[DisturbedCall, ...]:
        return tuple(DisturbedCall(call, why) for call, why in sorted(self._disturbed.items()))


class HostWatch:
    """Host readings of one piece's sampled calls.

    Args:
        forward, backward: host-clock series for the wall time of the forward and backward (None: not recorded, as on
            CPU runs, where the piece's own clock is the host's).
        waits: for a graph, where to note each call's wall time, run-queue wait and whether the process compiled
            during it (None for splits: their graph's calls cover them).
        compiles_started: reads how many compiles the process has started (Dynamo's compile callbacks).

    Example (a counter one millisecond per reading, no compile):
        >>> from thunderfx_debug.recording.timing import HostClock
        >>> ticks = iter(range(0, 10**9, 10**6))
        >>> clock = HostClock(counter=lambda: next(ticks))
        >>> watch = HostWatch(SampleSeries(clock), None, CallWaits(), compiles_started=lambda: 0, counter=clock.mark)
        >>> token = watch.begin(); watch.end(token, 6, Phase.FORWARD); watch.forward.resolve()
        >>> watch.forward.samples_ms, watch.waits.disturbed()
        ([1.0], ())
    """

    def __init__(self, forward: SampleSeries | None, backward: SampleSeries | None, waits: CallWaits | None,
                 compiles_started: Callable[[], int], counter: Callable[[], int] = time.perf_counter_ns):
        self.forward, self.backward, self.waits = forward, backward, waits
        self._compiles_started, self._counter = compiles_started, counter

    def begin(self) -> tuple[int, int, int | None]:
        if self.waits is None:
            return self._counter(), 0, None
        return self._counter(), self._compiles_started(), run_queue_wait_ns()

    def end(self, token: tuple[int, int, int | None], call: int, phase: Phase) -> None:
        start, compiles, wait = token
        now = self._counter()
        series = self.forward if phase is Phase.FORWARD else self.backward
        if series is not None:
            series.add(call, start, now)
        if self.waits is not None:
            waited = None
            if wait is not None:
                later = run_queue_wait_ns()
                waited = None if later is None else later - wait
            self.waits.add(call, phase, now - start, waited, self._compiles_started() != compiles)
