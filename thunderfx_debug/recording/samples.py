"""Bounded memory for the timing samples of one piece, over a run of any length.

A `SampleStream` takes every sample of a piece (a graph's forward, a fusion region, ...) and keeps, whatever the
run's length:
- streaming totals over all samples: count, sum, minimum, maximum (exact);
- at most `first + reservoir + recent` samples raw: the first ones of the run (warm-up is where surprises are),
  a uniform random sample of all of them (Vitter's algorithm R, seeded, so a run's selection is reproducible), from
  which quantiles are estimated (exact while the run took no more than `reservoir` samples), and the most recent
  ones (what the run does now);
- a coarse time series (`WindowSeries`): per window of consecutive samples, its calls, count, median, p90 and max.

Memory and the size of what is dumped are therefore flat: about 40 kB of memory per piece at the defaults, however
many samples arrive. A sample costs about a microsecond to add (on CPU), paid on sampled calls, where the samples of
earlier calls are resolved; unsampled calls pay nothing.
"""

from __future__ import annotations

import collections
import math
import random
import statistics
from array import array

from thunderfx_debug.records import SampleTotals, TimingWindow, percentile

#: Samples kept raw per piece: the first of the run, a uniform sample of all of them, the most recent.
KEEP_FIRST, RESERVOIR, KEEP_RECENT = 32, 128, 64
#: Windows of the time series at most (halved by merging neighbours when reached), and values kept per window.
MAX_WINDOWS, WINDOW_VALUES = 64, 16

#: A kept sample: (index of the sample in the stream, 0-based; call number of the piece's graph; milliseconds).
Sample = tuple[int, int, float]


class _Window:
    __slots__ = ("first_call", "last_call", "count", "max_ms", "values")

    def __init__(self, call: int):
        self.first_call = self.last_call = call
        self.count = 0
        self.max_ms = -math.inf
        self.values = array("d")

    def record(self) -> TimingWindow:
        values = sorted(self.values)
        return TimingWindow(self.first_call, self.last_call, self.count, statistics.median(values),
                            percentile(values, 0.9), self.max_ms)


class WindowSeries:
    """The time series of one piece's samples: windows of `width` consecutive samples each (the last one filling).

    Width starts at 1; when `max_windows` windows are complete, neighbours merge pairwise and the width doubles, so
    there are between max_windows / 2 and max_windows windows of equal width (plus the filling one) at any run length.
    Each window keeps its count, calls and maximum exactly, and at most `values` of its samples: all of them while
    they fit, else a uniform sample (algorithm R inside the window; a merge of two equal windows keeps every other
    value of their sorted union, alternating the start, as in the compactors of the KLL quantile sketch). Median and
    p90 are computed from those values: exact for windows of up to `values` samples, estimates beyond.

    Example (windows of at most 2 values, at most 4 windows):
        >>> series = WindowSeries(max_windows=4, values=2, rng=random.Random(0))
        >>> for call, ms in enumerate([1.0, 1.0, 1.0, 1.0, 5.0, 5.0], start=1): series.add(call, ms)
        >>> [(w.first_call, w.last_call, w.count, w.median_ms) for w in series.windows()]
        [(1, 2, 2, 1.0), (3, 4, 2, 1.0), (5, 6, 2, 5.0)]
    """

    def __init__(self, max_windows: int = MAX_WINDOWS, values: int = WINDOW_VALUES, rng: random.Random | None = None):
        if max_windows < 2 or max_windows % 2:
            raise ValueError("max_windows must be an even number >= 2")
        self.max_windows, self.values = max_windows, values
        self.width = 1
        self._rng = rng or random.Random(0)
        self._closed: list[_Window] = []
        self._closed_records: list[TimingWindow] = []  # of `_closed`, made once each (a flush reads them all)
        self._open: _Window | None = None
        self._start = 0  # which half a merge keeps, alternated so that neither the lower nor the upper one is favoured

    def add(self, call: int, ms: float) -> None:
        window = self._open
        if window is None:
            window = self._open = _Window(call)
        window.first_call, window.last_call = min(window.first_call, call), max(window.last_call, call)
        window.count += 1
        if ms > window.max_ms:
            window.max_ms = ms
        if len(window.values) < self.values:
            window.values.append(ms)
        else:
            slot = int(self._rng.random() * window.count)
            if slot < self.values:
                window.values[slot] = ms
        if window.count == self.width:
            self._closed.append(window)
            self._open = None
            if len(self._closed) == self.max_windows:
                self._closed = [self._merge(a, b) for a, b in zip(self._closed[0::2], self._closed[1::2])]
                self._closed_records = []
                self.width *= 2

    def _merge(self, a: _Window, b: _Window) -> _Window:
        merged = _Window(min(a.first_call, b.first_call))
        merged.last_call = max(a.last_call, b.last_call)
        merged.count = a.count + b.count
        merged.max_ms = max(a.max_ms, b.max_ms)
        values = sorted(a.values + b.values)
        if len(values) > self.values:
            values = values[self._start::2][: self.values]
            self._start ^= 1
        merged.values = array("d", values)
        return merged

    def windows(self) -> list[TimingWindow]:
        """The windows so far, oldest first, the filling one last."""
        records = self._closed_records
        records += [window.record() for window in self._closed[len(records):]]
        return records + ([self._open.record()] if self._open is not None else [])


class SampleStream:
    """Every sample of one piece in bounded memory (see the module docstring).

    Example (tiny capacities: the first 2 samples, a reservoir of 3, the last 2):
        >>> stream = SampleStream(first=2, reservoir=3, recent=2)
        >>> for call in range(1, 101): stream.add(call, float(call))
        >>> stream.count, stream.total_ms, stream.min_ms, stream.max_ms
        (100, 5050.0, 1.0, 100.0)
        >>> [call for _, call, _ in stream.kept()][:2], [call for _, call, _ in stream.kept()][-2:]
        ([1, 2], [99, 100])
        >>> len(stream.kept()) <= 7, len(stream.uniform())
        (True, 3)
    """

    def __init__(self, first: int = KEEP_FIRST, reservoir: int = RESERVOIR, recent: int = KEEP_RECENT,
                 max_windows: int = MAX_WINDOWS, window_values: int = WINDOW_VALUES, seed: int = 0):
        if reservoir < 1:
            raise ValueError("the reservoir must hold at least one sample")
        self._first_cap, self._reservoir_cap = first, reservoir
        self.count = 0
        self._sum = self._compensation = 0.0
        self.min_ms, self.max_ms = math.inf, -math.inf
        self._first: list[Sample] = []
        self._reservoir: list[Sample] = []
        self._recent: collections.deque[Sample] = collections.deque(maxlen=recent)
        self._rng = random.Random(seed)
        self.windows = WindowSeries(max_windows, window_values, self._rng)

    def add(self, call: int, ms: float) -> None:
        """One sample of `ms` milliseconds, taken on call `call` of the piece's graph."""
        index = self.count
        sample = (index, call, ms)
        self.count += 1
        # Neumaier's compensated sum: the total of a million samples stays exact to the last few digits.
        total = self._sum + ms
        if abs(self._sum) >= abs(ms):
            self._compensation += (self._sum - total) + ms
        else:
            self._compensation += (ms - total) + self._sum
        self._sum = total
        if ms < self.min_ms:
            self.min_ms = ms
        if ms > self.max_ms:
            self.max_ms = ms
        if index < self._first_cap:
            self._first.append(sample)
        if index < self._reservoir_cap:
            self._reservoir.append(sample)
        else:
            slot = int(self._rng.random() * (index + 1))  # algorithm R: sample `index` stays with p = cap / (index+1)
            if slot < self._reservoir_cap:
                self._reservoir[slot] = sample
        if self._recent.maxlen:
            self._recent.append(sample)
        self.windows.add(call, ms)

    @property
    def total_ms(self) -> float:
        return self._sum + self._compensation

    @property
    def complete(self) -> bool:
        """Whether every sample is still kept (the reservoir then holds them all)."""
        return self.count <= self._reservoir_cap

    def kept(self) -> list[Sample]:
        """The samples kept raw, in the order they arrived: the first ones, the reservoir, the recent ones."""
        if self.complete:
            return list(self._reservoir)
        by_index = {s[0]: s for s in (*self._first, *self._reservoir, *self._recent)}
        return [by_index[i] for i in sorted(by_index)]

    def uniform(self) -> list[Sample]:
        """The uniform random sample of all samples (all of them while `complete`), in the order they arrived."""
        return sorted(self._reservoir)

    def totals(self) -> SampleTotals:
        return SampleTotals(self.count, self.total_ms, self.min_ms, self.max_ms)
