"""Timing samples taken during training, without synchronising the device on the training path.

A `Clock` makes marks: CUDA events recorded on the current stream (read later, once `query()` says they are
complete, or at flush where waiting is allowed), or host perf_counter readings on CPU runs. A `SampleSeries` keeps
the samples of one piece in bounded memory (`samples.SampleStream`: the first ones, a uniform sample and the most
recent ones raw, totals over all, a time series); statistics are computed by the records (`records.Timing`).
`Sampling` decides which calls are timed: only every N-th call after a warm-up, so unsampled calls pay one comparison.

`DeviceHold` makes the marks of a sampled call time device work rather than waits for the host (fusion-level
timing on CUDA). `RegionTimer` receives the marks of the fusion regions of one thunder split, from the calls that
`thunder.instrument` inserts into its Thunder traces; `Ranges` names those regions for Nsight Systems and
torch.profiler.

The clock is injectable so that the sampling logic is tested with a fake clock and exact expected output.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from thunderfx_debug.records import BETWEEN_OPS, ClockKind, Phase, Timing
from thunderfx_debug.recording.samples import SampleStream
from thunderfx_debug.scripts import device_timer

if TYPE_CHECKING:
    from thunderfx_debug.settings.safety import ReportingFailures


class Clock(Protocol):
    kind: ClockKind

    def mark(self) -> Any:
        """Records a point in time on the device (or host) and returns its handle; must not synchronise."""

    def elapsed_ms(self, start: Any, end: Any, wait: bool) -> float | None:
        """Milliseconds from `start` to `end`, or None if `end` is not complete yet and `wait` is False."""

    def marker(self) -> Callable[[], Any]:
        """A `mark` for a run of marks made in order on one stream (a trace's), cheaper per mark; its marks are read
        with `offsets_ms` and then given back with `recycle`."""

    def offsets_ms(self, marks: Sequence[Any], wait: bool) -> list[float] | None:
        """Milliseconds from the first of a marker's `marks` to each of them (the first's is 0), or None if the last
        is not complete yet and `wait` is False."""

    def recycle(self, marks: Sequence[Any]) -> None:
        """Takes back marks read with `offsets_ms`, which nothing reads again."""


class HostClock:
    """perf_counter marks, for CPU runs (the work is done when the call returns)."""

    kind = ClockKind.HOST

    def __init__(self, counter: Callable[[], int] = time.perf_counter_ns):
        self._counter = counter

    def mark(self) -> int:
        return self._counter()

    def elapsed_ms(self, start: int, end: int, wait: bool) -> float:
        return (end - start) / 1e6

    def marker(self) -> Callable[[], int]:
        return self.mark

    def offsets_ms(self, marks: Sequence[int], wait: bool) -> list[float]:
        first = marks[0]
        return [(mark - first) / 1e6 for mark in marks]

    def recycle(self, marks: Sequence[int]) -> None:
        pass


class CudaClock:
    """CUDA events on the current stream (`device_timer`). `elapsed_ms` only waits (synchronises on the event) when
    asked to, which happens at flush, never on the training path.

    Events read and given back (`recycle`: by the region timers and the sample series once they read them) are
    recorded again rather than created, up to POOL of them. A trace's marks (`marker`) also read the stream once
    per trace (`Event.record()` without one asks torch for the current stream each time). On the H200 under load a
    mark with a new event cost 17-39 µs, a trace's mark 6 µs; a sampled call of an MoE makes hundreds."""

    kind = ClockKind.CUDA
    POOL = 4096

    def __init__(self):
        self._free: list[Any] = []

    def mark(self):
        try:
            event = self._free.pop()
            event.record()
        except (IndexError, RuntimeError):  # none free, or one of another device (a graph across devices)
            return device_timer.mark()
        return event

    def elapsed_ms(self, start, end, wait: bool) -> float | None:
        return device_timer.elapsed_ms(start, end, wait)

    def marker(self) -> Callable[[], Any]:
        import torch

        stream, free, new_event = torch.cuda.current_stream(), self._free, torch.cuda.Event

        def mark():
            try:
                event = free.pop()
                event.record(stream)
            # None free (another thread, the backward's, may have taken the last), or one created on another device
            # than the stream's (a graph across devices, whose backward runs on each device's thread): a new one.
            except (IndexError, RuntimeError):
                event = new_event(enable_timing=True)
                event.record(stream)
            return event

        return mark

    def offsets_ms(self, marks: Sequence[Any], wait: bool) -> list[float] | None:
        # On one stream, once the last mark is complete so are those before it: one query, and no wait after it.
        last = device_timer.elapsed_ms(marks[0], marks[-1], wait)
        if last is None:
            return None
        first = marks[0]
        return [0.0] + [first.elapsed_time(mark) for mark in marks[1:-1]] + [last]

    def recycle(self, marks: Sequence[Any]) -> None:
        free = self._free
        free.extend(marks[: max(self.POOL - len(free), 0)])


def clock_for(devices: set[str]) -> Clock:
    """CUDA events when any input lives on a CUDA device, the host clock otherwise."""
    return CudaClock() if any(d.startswith("cuda") for d in devices) else HostClock()


def bracket_cost_ms(clock: Clock, launch: Callable[[], None], hold: Callable[[], None] | None = None,
                    calls: int = 20, rounds: int = 9) -> float:
    """What a bracket of two marks adds to the time of the work inside it, in ms (median over `rounds`, at least 0).

    One `launch()` is timed alone between two marks, then `calls` back-to-back launches between two others; the
    single one's excess over its share of the run is the bracket's cost: the marks' own work and the restart of the
    stream after them, which kernels queued back to back do not pay. On the H200, forward regions of one kernel
    read a constant ~4 µs above the profiler's kernel time. `hold` (e.g. a `DeviceHold` sleep) runs before each
    round so that the device, not the host, sets the pace. Waits for the device: for benchmarks, not training.

    Example (a fake clock counting nanoseconds: 6 µs alone, 20 µs for 20 back to back, so a 5 µs bracket):
        >>> marks = iter([0, 6_000, 10_000, 30_000] * 9)
        >>> round(bracket_cost_ms(HostClock(counter=lambda: next(marks)), launch=lambda: None), 6)
        0.005
    """
    costs = []
    for _ in range(rounds):
        if hold is not None:
            hold()
        start = clock.mark()
        launch()
        end = clock.mark()
        run_start = clock.mark()
        for _ in range(calls):
            launch()
        run_end = clock.mark()
        single, run = clock.elapsed_ms(start, end, wait=True), clock.elapsed_ms(run_start, run_end, wait=True)
        costs.append(single - run / calls)
    return max(statistics.median(costs), 0.0)


#: A call number no run reaches: "never" for `Sampling.next_sampled` and its kind.
NEVER = 2**62


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Which calls are timed: call numbers (1-based) warmup+1, warmup+1+every, warmup+1+2*every, ...

    `next_sampled` lets the runners compare the call number with one integer on the calls in between.

    Example:
        >>> sampling = Sampling(every=50, warmup=5)
        >>> [sampling.next_sampled(call) for call in (0, 5, 6, 55, 56)]
        [6, 6, 56, 56, 106]
    """

    every: int
    warmup: int
    enabled: bool = True

    def is_sampled(self, call: int) -> bool:
        return self.enabled and call > self.warmup and (call - self.warmup - 1) % self.every == 0

    def index(self, call: int) -> int:
        """How many sampled calls there have been up to sampled call `call`, itself included (1 for the first)."""
        return (call - self.warmup - 1) // self.every + 1

    def next_sampled(self, after: int) -> int:
        """The first sampled call after call `after` (NEVER when timing is off)."""
        if not self.enabled:
            return NEVER
        first = self.warmup + 1
        if after < first:
            return first
        return first + ((after - first) // self.every + 1) * self.every


class SampleSeries:
    """The samples of one piece (a graph's forward, a split's backward, a fusion region...).

    A sample is the time from a start mark to an end mark (`add`), or a time read already (`add_measured`: a
    region timer's, which reads a trace's marks itself). Marks are stored as pending and resolved later: `resolve()`
    without waiting on sampled calls, `resolve(wait=True)` at flush; once read, they go back to the clock
    (`Clock.recycle`). Resolved samples go to `stream`, which holds any number of them in bounded memory
    (`samples.SampleStream`).

    Example (a fake clock whose marks are numbers of milliseconds):
        >>> series = SampleSeries(HostClock(counter=iter([0, 2_000_000, 5_000_000, 6_000_000]).__next__))
        >>> series.add(6, series.clock.mark(), series.clock.mark())
        >>> series.add(11, series.clock.mark(), series.clock.mark())
        >>> series.resolve(); series.samples_ms, series.calls
        ([2.0, 1.0], [6, 11])
    """

    def __init__(self, clock: Clock, stream: SampleStream | None = None):
        self.clock = clock
        self.stream = stream if stream is not None else SampleStream()
        self._pending: list[tuple[int, Any, Any]] = []
        self._timing: tuple[int, Timing] | None = None  # (samples it was built from, the record)

    @property
    def samples_ms(self) -> list[float]:
        """The samples kept raw, in the order they were resolved (all of them on a short run)."""
        return [ms for _, _, ms in self.stream.kept()]

    @property
    def calls(self) -> list[int]:
        """The call numbers of `samples_ms`."""
        return [call for _, call, _ in self.stream.kept()]

    def add(self, call: int, start: Any, end: Any) -> None:
        """One sample of call `call` (1-based call number of the piece's graph): from mark `start` to mark `end`,
        two marks of its own (they go back to the clock once read)."""
        self._pending.append((call, start, end))

    def add_measured(self, call: int, ms: float) -> None:
        """One sample of call `call` already measured (nothing pending)."""
        self.stream.add(call, ms)

    def resolve(self, wait: bool = False) -> None:
        """Turns pending marks into samples; with `wait=False` (the training path) marks that are not complete stay
        pending and nothing waits for the device."""
        if not self._pending:
            return
        still_pending, read = [], []
        for call, start, end in self._pending:
            elapsed = self.clock.elapsed_ms(start, end, wait)
            if elapsed is None:
                still_pending.append((call, start, end))
            else:
                self.stream.add(call, elapsed)
                read += (start, end)
        self._pending = still_pending
        self.clock.recycle(read)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def timing(self) -> Timing | None:
        """The record of the resolved samples; None when nothing was ever sampled. Built again only when samples
        arrived since the last call (a flush reads every series; most did not change)."""
        stream = self.stream
        if stream.count == 0 and not self._pending:
            return None
        if self._timing is not None and self._timing[0] == stream.count:
            return self._timing[1]
        kept = sorted(stream.kept(), key=lambda s: (s[1], s[0]))  # by call; arrival order among equal calls
        totals = uniform = None
        if not stream.complete:
            position = {s[0]: i for i, s in enumerate(kept)}
            uniform = tuple(sorted(position[s[0]] for s in stream.uniform()))
            totals = stream.totals()
        timing = Timing(
            samples_ms=tuple(ms for _, _, ms in kept),
            calls=tuple(call for _, call, _ in kept),
            clock=self.clock.kind,
            all_samples=totals,
            uniform=uniform,
            windows=tuple(stream.windows.windows()),
        )
        self._timing = (stream.count, timing)
        return timing


@dataclasses.dataclass
class _HeldPhase:
    """One held phase of a sampled call: when the host queued the hold, the marks before and after its sleep, and
    the host's lead over the device in each trace the region timers marked in it (see `DeviceHold.held`)."""

    call: int
    host_start: int  # host counter (ns), read before the mark before the sleep
    before: Any  # the clock's mark before the sleep (None without a clock)
    after: Any  # and after it
    ended: bool = False  # `DeviceHold.end` read the phase's host time
    traces: int = 0  # traces marked in the phase, by the timers in `timers`
    timers: list[Any] = dataclasses.field(default_factory=list)
    leads: list[float | None] = dataclasses.field(default_factory=list)  # one per trace read so far (`trace_lead`)
    slept_ms: float | None = None  # the sleep as the device ran it, once read
    # The call's first held phase (its forward), where this is a later one: the device's lag behind the host at
    # this phase's start is read against it (`DeviceHold.trace_lead`); and that lag in ms, once read.
    origin: _HeldPhase | None = None
    behind_ms: float | None = None


class DeviceHold:
    """Holds the device back at the start of a sampled call's forward and backward, so that the host queues the
    graph's work ahead of the device and every mark of that call times device work (fusion-level timing on CUDA).

    Why: on a launch-bound model the device idles between a region's start event and its first kernel while the
    host runs Thunder's and nvFuser's launch code, and the events count that wait as region time (forward regions
    of a 2-layer GPT on the H200 measured 3-13x their kernels' span). A sleep kernel enqueued before the first mark
    lets the host run ahead, so the events bracket kernels that run back to back. A sampled call pays the part of
    the sleep that the device cannot make up (nothing where the device would have waited for the host anyway); other
    calls pay nothing, and no result changes.

    How long: the sleep must cover the host's lead, not its whole time. A span between two marks of a region timer
    times device work when the device reaches its start mark only after the host queued its end mark. With a
    clock, the timers keep the host time once each mark was queued on the calls it held (`held`), and when they
    read a trace's marks (without waiting) they hand its largest lead to the hold (`trace_lead`); on the next
    sampled call of the phase, once every trace of the last one was read, the sleep is FACTOR times the largest
    lead of the host over the device's work up to a span (`_lead_ms`) plus SPARE of the phase's host time, never
    more than FACTOR times the phase's host time; in a call's backward, the device's lag behind the host left from
    its forward counts toward the lead (`_behind_ms`). A device whose work keeps up with the host then sleeps
    less; a host-bound step sleeps about its host time, as it must (the H200's realistic Llama: lead-sized
    sleeps of about its phases' host time; the Mixtral on a shared GPU: a quarter shorter, benchmarks/RESULTS.md).
    Where the last held call gives no answer (its first sampled call, marks not complete, or a span the device may
    have reached before the host queued its end: then its samples may hold a wait, and the sleep was too short),
    the sleep is FACTOR times the phase's host time on its last sampled call (first sampled call: FIRST_MS), within
    `device_timer`'s limits for a hold (1 ms to 1 s).

    One hold serves a graph and its splits: `begin` sleeps once per phase of a call, whichever piece's mark comes
    first (in the backward, autograd may run a split's hook before the graph's), and only the graph calls `end`.
    `sleep(cycles)` is `torch.cuda._sleep` (a spin kernel on the current stream, as torch's own stream tests use),
    and `cycles_per_ms` the device's clock rate in kHz.

    Example (a recording sleep and a host counter one millisecond per reading; no clock: host time alone):
        >>> slept, ticks = [], iter(range(0, 10**9, 10**6))
        >>> hold = DeviceHold(slept.append, cycles_per_ms=1000, counter=lambda: next(ticks))
        >>> hold.begin(Phase.FORWARD, call=11); hold.begin(Phase.FORWARD, call=11); hold.end(Phase.FORWARD)
        >>> hold.begin(Phase.FORWARD, call=61); slept
        [10000, 1250]
    """

    FIRST_MS, FACTOR, SPARE = 10.0, 1.25, 0.1

    def __init__(self, sleep: Callable[[int], None], cycles_per_ms: float,
                 counter: Callable[[], int] = time.perf_counter_ns, clock: Clock | None = None):
        self._sleep, self._cycles_per_ms, self._counter = sleep, cycles_per_ms, counter
        self._clock = clock
        self._host_ms: dict[Phase, float] = {}
        self._held: dict[Phase, _HeldPhase] = {}
        #: How the sleeps were sized: "first" (nothing known), "whole" (the phase's host time), "lead" (the host's
        #: lead): [how many, milliseconds asked for in all]; for benchmarks that ask what the holds cost.
        self.sleeps: dict[str, list[float]] = {"first": [0, 0.0], "whole": [0, 0.0], "lead": [0, 0.0]}

    @classmethod
    def for_current_cuda_device(cls) -> "DeviceHold":
        import torch

        return cls(torch.cuda._sleep, device_timer.cycles_per_ms(), clock=CudaClock())

    @property
    def now(self) -> Callable[[], int]:
        """The host counter the hold reads (ns); timers read it for `trace_lead`."""
        return self._counter

    def sleep_ms(self, ms: float) -> None:
        """Enqueues a sleep of about `ms` milliseconds on the current stream, within `device_timer`'s limits."""
        self._sleep(device_timer.hold_cycles(ms, self._cycles_per_ms))

    def begin(self, phase: Phase, call: int) -> None:
        """Before the first mark of the phase of sampled call `call`: enqueue the sleep and start the host clock of
        the phase; nothing if this phase of this call was already held."""
        previous = self._held.get(phase)
        if previous is not None and previous.call == call:
            return
        ms = self._sleep_ms(phase, previous)
        clock = self._clock
        host_start = self._counter()
        before = clock.mark() if clock is not None else None
        self.sleep_ms(ms)
        after = clock.mark() if clock is not None else None
        origin = next((h for h in self._held.values() if h.call == call and h.origin is None), None)
        self._held[phase] = _HeldPhase(call, host_start, before, after, origin=origin)

    def end(self, phase: Phase) -> None:
        """After the phase's last mark: how long the host took to queue it sizes the next sleep."""
        held = self._held.get(phase)
        if held is not None and not held.ended:
            held.ended = True
            self._host_ms[phase] = (self._counter() - held.host_start) / 1e6

    def held(self, phase: Phase, call: int) -> _HeldPhase | None:
        """The held `phase` of sampled call `call`, where a region timer of this graph reports its traces' leads
        (`trace_lead`); None where this hold did not hold that call, or has no clock to read the marks with."""
        held = self._held.get(phase)
        if held is None or held.call != call or self._clock is None:
            return None
        return held

    def trace_lead(self, held: _HeldPhase, first: Any, offsets: Sequence[float], queued: Sequence[int]) -> None:
        """Reads the host's largest lead over the device in one trace of `held`, whose marks came `offsets` ms after
        its `first` mark on the device and were queued at host counter `queued` (ns), and keeps it for the next
        sleep: for each span between two marks, the host's time until its end was queued less the device's work
        before its start (after the sleep). None (the next sleep is the whole host time) where the device may have
        reached a span's start before its end was queued (the sleep was too short for that call)."""
        clock = self._clock
        lead = None
        if held.slept_ms is None:
            held.slept_ms = clock.elapsed_ms(held.before, held.after, wait=False)
        if held.behind_ms is None:
            held.behind_ms = self._behind_ms(held)
        # The device came to `before` no earlier than `behind_ms` after the host read `host_start`, so it came to
        # each span's start at least `reached` after it: reached after `queued_ms`, the span's kernels were all queued.
        reached_first = clock.elapsed_ms(held.before, first, wait=False)
        if held.slept_ms is not None and reached_first is not None:
            lead, slept, host_start = 0.0, held.slept_ms, held.host_start
            reached_first += held.behind_ms
            for offset, queued_ns in zip(offsets, queued[1:]):
                reached, queued_ms = reached_first + offset, (queued_ns - host_start) / 1e6
                if reached < queued_ms:
                    lead = None
                    break
                lead = max(lead, queued_ms - (reached - slept))
        held.leads.append(lead)

    def _behind_ms(self, held: _HeldPhase) -> float:
        """How far the device was behind the host at least when the host began `held`: 0 for a call's first held
        phase; for a later one (the backward), what the device took from the first phase's `before` to this one's
        beyond what the host took, since the device came to the first no earlier than the host began it. The
        forward's sleep and work that the device has not made up by the backward's start then count toward the
        backward's sleep instead of being slept again."""
        origin = held.origin
        if origin is None:
            return 0.0
        device_ms = self._clock.elapsed_ms(origin.before, held.before, wait=False)
        if device_ms is None:
            return 0.0
        return max(device_ms - (held.host_start - origin.host_start) / 1e6, 0.0)

    def _sleep_ms(self, phase: Phase, previous: _HeldPhase | None) -> float:
        host_ms = self._host_ms.get(phase)
        if host_ms is None:
            return self._sized("first", self.FIRST_MS)
        whole = self.FACTOR * host_ms
        lead = self._lead_ms(previous) if previous is not None and previous.traces else None
        if lead is None or self.FACTOR * lead + self.SPARE * host_ms >= whole:
            return self._sized("whole", whole)
        return self._sized("lead", self.FACTOR * lead + self.SPARE * host_ms)

    def _sized(self, rule: str, ms: float) -> float:
        counts = self.sleeps[rule]
        counts[0] += 1
        counts[1] += ms
        return ms

    def _lead_ms(self, held: _HeldPhase) -> float | None:
        """The host's largest lead over the device in `held`, over all its traces; None where one of them is not
        read yet (its marks are not complete) or gave no lead (`trace_lead`)."""
        for timer in held.timers:  # the traces of a held call are read here at the latest: its sleep needs them
            timer.resolve()
        leads = held.leads
        if len(leads) < held.traces or None in leads:
            return None
        return max(leads)


class Ranges:
    """Named ranges that show up in Nsight Systems (NVTX, on CUDA builds with a device) and in torch.profiler
    (`record_function`), pushed and popped in stack order. They cost a few microseconds of host time each, on every
    call: an option for profiling sessions (THUNDERFX_DEBUG_NVTX=1), not for every run."""

    def __init__(self):
        import torch

        self._nvtx = torch.cuda.nvtx if torch.cuda.is_available() else None
        self._record_function = torch.autograd.profiler.record_function
        self._open: list[Any] = []

    def push(self, name: str) -> None:
        if self._nvtx is not None:
            self._nvtx.range_push(name)
        scope = self._record_function(name)
        scope.__enter__()
        self._open.append(scope)

    def pop(self) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)
        if self._nvtx is not None:
            self._nvtx.range_pop()


class RegionTimer:
    """The clock marks of one thunder split's fusion regions, called by the split's instrumented Thunder traces.

    An instrumented trace calls `begin_trace(phase)` (a `Phase` value), then `begin_region(key)` / `end_region(key)`
    around each fusion region (key: "nvFusion0_forward"), then `end_trace(phase)`. A run of the trace records only
    while its phase is armed with the number of a sampled call: `forward_call` is set by the split's runner around the
    forward of a sampled call, `backward_call` by the gradient hooks of that call (see `sampler.BackwardMarks`).
    Other runs pay one attribute check per mark.

    A recorded trace's marks are read later (`resolve`: without waiting at the start of the next sampled trace, and
    by the hold that needs them; waiting at flush), all at once, each as its distance from the trace's first mark:
    one reading per mark. Then each region's time goes to `series[key]`, and the gaps between regions (from the
    trace's start to the first region, between regions, from the last region to the end) to
    `series["outside_<phase>"]`, so the regions and the outside time of a call add up to the whole trace.

    Where the trace also marks its ops (`mark_op(symbol, executor)` before each op outside the regions, see
    `thunder.instrument`), the outside time is split further, by op group: from an op's mark to the next mark is
    that op's time, summed per (symbol, executor) into `op_series[(phase, symbol, executor)]`, and what no op opened
    (a trace's start, what follows a region until the next op) goes to `records.BETWEEN_OPS`, executor "thunder".
    `op_counts` gets how many ops of each group the trace has. The groups of a call add up to its outside time.

    Args:
        clock: makes the marks (CUDA events on the current stream, or host time).
        series: the split's `region_series`, filled here (created on first use).
        ranges: with a name prefix ("graph0/thunder_0"), every run (sampled or not) also opens a named range per
            region and per trace, "graph0/thunder_0/nvFusion0_forward" (see `Ranges`); None for no ranges.
        op_series, op_counts: the split's op groups, filled here (see above).
        hold: the graph's `DeviceHold` (fusion timing on CUDA): on the calls it held, the host time once each mark
            was queued is kept, and the trace's lead over the device read from it (`DeviceHold.trace_lead`) sizes
            the hold's next sleep.
        failures, label: where a failure of a recording trace's marks goes ("timing the fusion regions of
            <label>"): the marks run inside Thunder's trace, in the training's forward and backward, so a mark that
            raises (a CUDA error recording an event) drops that trace's samples and the training goes on (strict
            failures raise). Without `failures` the error goes on into the trace.

    Example (host clock counting one millisecond per mark):
        >>> ticks = iter(range(0, 10**9, 10**6))
        >>> timer = RegionTimer(HostClock(counter=lambda: next(ticks)), series={})
        >>> timer.forward_call = 6
        >>> timer.begin_trace("forward"); timer.begin_region("F0_forward"); timer.end_region("F0_forward")
        >>> timer.end_trace("forward"); timer.forward_call = 0
        >>> timer.resolve()
        >>> {k: (s.samples_ms, s.calls) for k, s in timer.series.items()}
        {'F0_forward': ([1.0], [6]), 'outside_forward': ([2.0], [6])}
    """

    #: The marks need no region values (`thunder.instrument` then passes none).
    observes_values = False

    def __init__(self, clock: Clock, series: dict[str, SampleSeries], ranges: tuple[Ranges, str] | None = None,
                 op_series: dict[tuple[str, str, str], SampleSeries] | None = None,
                 op_counts: dict[tuple[str, str, str], int] | None = None, hold: DeviceHold | None = None,
                 failures: ReportingFailures | None = None, label: str = ""):
        self.clock = clock
        self.hold = hold
        self.failures, self.label = failures, label
        self.series = series
        self.op_series = op_series if op_series is not None else {}
        self.op_counts = op_counts if op_counts is not None else {}
        self.forward_call = 0
        self.backward_call = 0
        self._ranges, self._prefix = ranges if ranges is not None else (None, "")
        self._call = 0  # the sampled call the running trace records, 0 when it does not record
        self._phase = ""
        self._mark_now: Callable[[], Any] | None = None  # the running trace's `Clock.marker`
        self._keys: list[str | tuple[str, str] | None] = []  # what each mark of the running trace is
        self._marks: list[Any] = []
        self._queued: list[int] | None = None  # host counter after each mark, on calls the hold held
        self._held: _HeldPhase | None = None
        self._recorded: list[_RecordedTrace] = []  # traces whose marks are not read yet
        self._reading = threading.Lock()

    # ---- called by the instrumented traces ------------------------------------------------------------------------
    def begin_trace(self, phase: str) -> None:
        if self._ranges is not None:
            self._ranges.push(f"{self._prefix} {phase}")
        call = self.forward_call if phase == Phase.FORWARD else self.backward_call
        if not call:
            return
        self._call, self._phase = call, phase
        try:
            self.resolve()  # earlier traces whose marks are complete, without waiting
            self._mark_now = self.clock.marker()
            self._keys, self._marks = [None], [self._mark_now()]
            self._held = self.hold.held(Phase(phase), call) if self.hold is not None else None
            if self._held is not None:
                self._queued = [self.hold.now()]
        except Exception as error:
            self._drop_trace(error)

    def begin_region(self, key: str, *inputs) -> None:
        if self._ranges is not None:
            self._ranges.push(f"{self._prefix}/{key}")
        if self._call:
            self._mark(key)

    def end_region(self, key: str, *outputs) -> None:
        if self._call:
            self._mark(key)
        if self._ranges is not None:
            self._ranges.pop()

    def mark_op(self, symbol: str, executor: str) -> None:
        if self._call:
            self._mark((symbol, executor))

    def end_trace(self, phase: str) -> None:
        if self._call and phase == self._phase:
            self._mark(None)  # where it fails, the trace is dropped (`_call` is 0)
            if self._call:
                held = self._held
                self._recorded.append(_RecordedTrace(self._call, phase, self._keys, self._marks, self._queued, held))
                if held is not None:
                    held.traces += 1
                    if self not in held.timers:
                        held.timers.append(self)
                if phase == Phase.BACKWARD:
                    self.backward_call = 0  # one backward per sampled call
        self._call, self._keys, self._marks, self._queued, self._held, self._mark_now = 0, [], [], None, None, None
        if self._ranges is not None:
            self._ranges.pop()

    def _mark(self, key) -> None:
        try:
            self._marks.append(self._mark_now())
            self._keys.append(key)
            if self._queued is not None:
                self._queued.append(self.hold.now())
        except Exception as error:
            self._drop_trace(error)

    def _drop_trace(self, error: Exception) -> None:
        """A mark of the recording trace failed: the trace records nothing more (its later marks pass, its samples
        are not kept), and the failure goes to `failures` (raised where strict, or where there are none)."""
        if self._phase == Phase.BACKWARD:
            self.backward_call = 0
        self._call, self._keys, self._marks, self._queued, self._held, self._mark_now = 0, [], [], None, None, None
        if self.failures is None:
            raise error
        with self.failures.guard(f"timing the fusion regions of {self.label or 'a thunder split'}"):
            raise error

    # ---- called by the runner's hooks -----------------------------------------------------------------------------
    def disarm_backward(self) -> None:
        self.backward_call = 0

    # ---- reading the marks ----------------------------------------------------------------------------------------
    def resolve(self, wait: bool = False) -> None:
        """Reads the recorded traces whose marks are complete into the series (with `wait`, all of them: at flush);
        the others stay recorded. One reader at a time: the training thread, autograd's and the flush may all ask,
        and a trace is read once (without `wait`, a reader finding another at work leaves it to that one)."""
        if not self._recorded or not self._reading.acquire(blocking=wait):
            return
        try:
            count = len(self._recorded)  # the training thread may append more meanwhile
            unread = [trace for trace in self._recorded[:count] if not self._read(trace, wait)]
            self._recorded[:count] = unread
        finally:
            self._reading.release()

    @property
    def pending(self) -> int:
        """Recorded traces not read yet."""
        return len(self._recorded)

    def _read(self, trace: _RecordedTrace, wait: bool) -> bool:
        offsets = self.clock.offsets_ms(trace.marks, wait)
        if offsets is None:
            return False
        self._store(trace.call, trace.phase, trace.keys, offsets)
        if trace.held is not None:
            self.hold.trace_lead(trace.held, trace.marks[0], offsets, trace.queued)
        self.clock.recycle(trace.marks)
        return True

    def _store(self, call: int, phase: str, keys: list, at: list[float]) -> None:
        # keys: trace start (None), then in trace order a region's start and end (its key twice) and ops (a
        # (symbol, executor) pair each), trace end (None); at: each mark's ms after the trace's start
        between = (BETWEEN_OPS, "thunder")
        outside, op_ms, op_counts = 0.0, {}, {}
        gap_start = span_start = 0.0
        current, region_start = between, None
        for key, t in zip(keys[1:-1], at[1:-1]):
            if isinstance(key, tuple):  # an op: the time since the last mark was the previous op's
                op_ms[current] = op_ms.get(current, 0.0) + (t - span_start)
                op_counts[key] = op_counts.get(key, 0) + 1
                current, span_start = key, t
            elif region_start is None:  # a region starts: the gap before it ends
                op_ms[current] = op_ms.get(current, 0.0) + (t - span_start)
                outside += t - gap_start
                region_start = t
            else:  # the region ends
                self._series(key).add_measured(call, t - region_start)
                region_start, current, gap_start, span_start = None, between, t, t
        end = at[-1]
        self._series(f"outside_{phase}").add_measured(call, outside + (end - gap_start))
        if op_counts:  # the trace marks its ops: the outside time by op group
            op_ms[current] = op_ms.get(current, 0.0) + (end - span_start)
            for (symbol, executor), ms in op_ms.items():
                key = (phase, symbol, executor)
                series = self.op_series.get(key)
                if series is None:
                    series = self.op_series[key] = SampleSeries(self.clock)
                series.add_measured(call, ms)
                self.op_counts[key] = op_counts.get((symbol, executor), 0)

    def _series(self, key: str) -> SampleSeries:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = SampleSeries(self.clock)
        return series


@dataclasses.dataclass
class _RecordedTrace:
    """One sampled run of an instrumented trace, its marks not read yet (see `RegionTimer`)."""

    call: int
    phase: str
    keys: list[str | tuple[str, str] | None]
    marks: list[Any]
    queued: list[int] | None  # host counter once each mark was queued, on calls the hold held
    held: _HeldPhase | None
