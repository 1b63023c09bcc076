"""Timing samples taken during training, without synchronising the device on the training path.

A `Clock` makes marks: CUDA events recorded on the current stream (read later, once `query()` says they are
complete, or at flush where waiting is allowed), or host perf_counter readings on CPU runs. A `SampleSeries` keeps
the raw samples of one piece; statistics are computed by the records (`records.Timing`). `Sampling` decides which
calls are timed: only every N-th call after a warm-up, so unsampled calls pay one comparison.

The clock is injectable so that the sampling logic is tested with a fake clock and exact expected output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from thunderfx_debug.records import Timing


class Clock(Protocol):
    name: str

    def mark(self) -> Any:
        """Records a point in time on the device (or host) and returns its handle; must not synchronise."""

    def elapsed_ms(self, start: Any, end: Any, wait: bool) -> float | None:
        """Milliseconds from `start` to `end`, or None if `end` is not complete yet and `wait` is False."""


class HostClock:
    """perf_counter marks, for CPU runs (the work is done when the call returns)."""

    name = "host"

    def __init__(self, counter: Callable[[], int] = time.perf_counter_ns):
        self._counter = counter

    def mark(self) -> int:
        return self._counter()

    def elapsed_ms(self, start: int, end: int, wait: bool) -> float:
        return (end - start) / 1e6


class CudaClock:
    """CUDA events on the current stream. `elapsed_ms` only waits (synchronises on the event) when asked to,
    which happens at flush, never on the training path."""

    name = "cuda"

    def mark(self):
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start, end, wait: bool) -> float | None:
        if not end.query():
            if not wait:
                return None
            end.synchronize()
        return start.elapsed_time(end)


def clock_for(devices: set[str]) -> Clock:
    """CUDA events when any input lives on a CUDA device, the host clock otherwise."""
    return CudaClock() if any(d.startswith("cuda") for d in devices) else HostClock()


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Which calls are timed: call numbers (1-based) warmup+1, warmup+1+every, warmup+1+2*every, ..."""

    every: int
    warmup: int
    enabled: bool = True

    def is_sampled(self, call: int) -> bool:
        return self.enabled and call > self.warmup and (call - self.warmup - 1) % self.every == 0


class SampleSeries:
    """The samples of one piece (a graph's forward, a split's backward, a fusion region...).

    Marks are stored as pending pairs and resolved later: `resolve()` without waiting on sampled calls,
    `resolve(wait=True)` at flush.
    """

    def __init__(self, clock: Clock):
        self.clock = clock
        self.samples_ms: list[float] = []
        self.calls: list[int] = []
        self._pending: list[tuple[int, Any, Any]] = []

    def add(self, call: int, start: Any, end: Any) -> None:
        self._pending.append((call, start, end))

    def resolve(self, wait: bool = False) -> None:
        still_pending = []
        for call, start, end in self._pending:
            elapsed = self.clock.elapsed_ms(start, end, wait)
            if elapsed is None:
                still_pending.append((call, start, end))
            else:
                self.samples_ms.append(elapsed)
                self.calls.append(call)
        self._pending = still_pending

    @property
    def pending(self) -> int:
        return len(self._pending)

    def timing(self) -> Timing | None:
        """The record of the resolved samples; None when nothing was ever sampled."""
        if not self.samples_ms and not self._pending:
            return None
        order = sorted(range(len(self.calls)), key=self.calls.__getitem__)
        return Timing(
            samples_ms=tuple(self.samples_ms[i] for i in order),
            calls=tuple(self.calls[i] for i in order),
            clock=self.clock.name,
        )
