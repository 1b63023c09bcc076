"""The trigger of the periodic flush (THUNDERFX_DEBUG_FLUSH_EVERY), on the training path.

Every call of a recorded graph compares one clock reading with the time the next flush is due
(`runners.GraphRunner`): 45-110 ns a call on the 2-core CPU machines of this project (`benchmarks/flush_pause.py`
measures it), on unsampled calls too. When it is due, the flush runs right there, in the
training thread, between two graph calls: no timer thread, so nothing but the training thread ever touches the
device or Thunder (the flush's writer thread gets finished records only; see `flusher`).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PeriodicFlush:
    """Calls `flush` once `every_s` seconds have passed since the last call (or since this was built).

    The runner reads `clock()` and `due_at` itself (a method call would cost more than the check) and calls
    `fire()` when due. `flush` returns False when it could not start (the previous flush still writing): it is then
    tried again `RETRY_S` seconds later rather than a whole period later. A flush that raises is not retried on
    every call: the next one is due a period later.

    Example (a fake clock):
        >>> now, flushed = [0.0], []
        >>> periodic = PeriodicFlush(600, lambda: flushed.append(now[0]), clock=lambda: now[0])
        >>> for now[0] in (10.0, 599.0, 601.0, 900.0, 1202.0):
        ...     if periodic.clock() >= periodic.due_at: periodic.fire()
        >>> flushed
        [601.0, 1202.0]
    """

    RETRY_S = 1.0

    def __init__(self, every_s: float, flush: Callable[[], object], clock: Callable[[], float] = time.monotonic):
        if not every_s > 0:
            raise ValueError("every_s must be > 0 (no PeriodicFlush at all turns periodic flushes off)")
        self.every_s, self._flush, self.clock = every_s, flush, clock
        self.due_at = clock() + every_s

    def fire(self) -> None:
        self.due_at = self.clock() + self.every_s
        if self._flush() is False:
            self.due_at = self.clock() + min(self.every_s, self.RETRY_S)
