"""The host's side of a sampled call: its wall time (perf_counter) beside the device time the clock measures, and
whether something disturbed it (the process compiled during the call, or the thread waited for a CPU).

`HostWatch.begin()` before a phase of a sampled call and `HostWatch.end(...)` after it cost two perf_counter readings,
plus, for a graph, a read of Dynamo's compile counter and of the thread's run-queue wait (`run_queue_wait_ns`,
about 5-15 µs on Linux, nothing elsewhere). Only sampled calls pay.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable

from thunderfx_debug.records import Disturbance, DisturbedCall, Phase
from thunderfx_debug.recording.timing import SampleSeries

#: A call whose thread waited for a CPU for more than this share of its wall time, and more than PREEMPTED_FACTOR times
#: the share its graph's sampled calls typically waited, was preempted: the machine's other work slowed it more than
#: the others (on a machine loaded evenly, every call waits alike and none is singled out).
PREEMPTED_SHARE = 0.10
PREEMPTED_FACTOR = 2.0

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


@dataclasses.dataclass
class CallWaits:
    """Per sampled call of a graph: host wall ns and run-queue wait ns (forward and backward added), and whether the
    process compiled during it. `disturbed()` applies the rules of `records.Disturbance`."""

    wall_ns: dict[int, int] = dataclasses.field(default_factory=dict)
    wait_ns: dict[int, int] = dataclasses.field(default_factory=dict)
    compiled: set[int] = dataclasses.field(default_factory=set)

    def add(self, call: int, wall_ns: int, wait_ns: int | None, compiled: bool) -> None:
        self.wall_ns[call] = self.wall_ns.get(call, 0) + wall_ns
        if wait_ns is not None:
            self.wait_ns[call] = self.wait_ns.get(call, 0) + wait_ns
        if compiled:
            self.compiled.add(call)

    def disturbed(self) -> tuple[DisturbedCall, ...]:
        shares = {call: self.wait_ns[call] / wall for call, wall in self.wall_ns.items()
                  if call in self.wait_ns and wall > 0}
        typical = statistics.median(shares.values()) if shares else 0.0
        preempted = {call for call, share in shares.items()
                     if share > PREEMPTED_SHARE and share > PREEMPTED_FACTOR * typical}
        result = [DisturbedCall(call, Disturbance.COMPILE) for call in sorted(self.compiled)]
        result += [DisturbedCall(call, Disturbance.PREEMPTED) for call in sorted(preempted - self.compiled)]
        return tuple(sorted(result, key=lambda d: d.call))


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
        >>> watch.forward.samples_ms, watch.waits.wall_ns
        ([1.0], {6: 1000000})
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
            self.waits.add(call, now - start, waited, self._compiles_started() != compiles)
