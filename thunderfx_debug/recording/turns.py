"""Turns: which of their scheduled calls pieces take, so that what they spend stays within a share of the
training's wall time. The correctness sentinel's checks (THUNDERFX_DEBUG_CHECK_SHARE, one turn per Thunder split)
and timing's sampled calls (THUNDERFX_DEBUG_TIMING_SHARE, one turn per graph) each keep their own `Turns`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator


class Turns:
    """Which of its scheduled calls each piece takes, so that the pieces together spend about `percent` % of the
    training's wall time (100: every piece on every scheduled call). The correctness sentinel's pieces are the
    Thunder splits (THUNDERFX_DEBUG_CHECK_SHARE), timing's the graphs (THUNDERFX_DEBUG_TIMING_SHARE).

    Why: a check costs what its references cost on the device, waited for (an eager forward and backward of the
    split, the float64 one where eager's own error is too large, a reference per fusion region): on the H200's
    realistic Llama about 15 ordinary steps, so checking every split on every 50th call costs about 28 %. A call
    sampled at fusion level costs the Mixtral's step about its own length again (marks, their reading and the
    device hold, benchmarks/RESULTS.md). No faster host path removes that; doing it less often does. Each piece gets
    a credit of time that grows with the training's wall time, in proportion to what its own turn costs (so every
    piece comes round equally often: once per the sum of their costs over the share), and takes a scheduled call
    when its credit is not below zero; what the turn then spends (`spending`: the blocks of its work, waits for the
    device included; or `charge`: a cost measured afterwards) is taken from the credit. The credit does not build
    up beyond zero, so no scheduled call takes more than each piece once. A graph's first call takes every piece
    (as THUNDERFX_DEBUG_CHECK_EVERY promises for checks); their turns are then spread over the period, the k-th of
    n pieces first due after (k + 1) / n of it, so that they do not all fall on one call. Each piece counts the
    scheduled calls it passed over (`Turn.passed_over`: `Check.passed_over`, `GraphRecord.timing_passed_over`).

    Example (a host counter in ms: two splits whose checks cost 10 and 30 ms, a 10 % share: each comes round every
    (10 + 30) / 0.1 = 400 ms of training, the first due 200 ms after the first call, the second 400 ms after):
        >>> now = [0]
        >>> turns = Turns(10.0, counter=lambda: now[0] * 10**6)
        >>> splits = [(turns.join(), 10), (turns.join(), 30)]
        >>> def scheduled(at, call):
        ...     now[0], taken = at, []
        ...     for turn, cost in splits:
        ...         taken.append(turn.take(call))
        ...         if taken[-1]:
        ...             with turn.spending():
        ...                 now[0] += cost
        ...     return taken
        >>> [scheduled(at, call) for at, call in ((0, 1), (150, 51), (210, 101), (300, 151), (420, 201))]
        [[True, True], [False, False], [True, False], [False, False], [False, True]]
    """

    #: A piece not asked for this long (ns) is left out of the sum of the turns' costs (see `_take`).
    STALE_NS = 600 * 10**9

    def __init__(self, percent: float, counter: Callable[[], int] = time.perf_counter_ns):
        self.share = None if percent >= 100 else percent / 100
        self.counter = counter
        self._turns: list[Turn] = []

    def join(self) -> "Turn":
        turn = Turn(self, len(self._turns))
        self._turns.append(turn)
        return turn

    def _take(self, turn: "Turn", call: int) -> bool:
        now = self.counter()
        if turn.spent_ns:  # its last turn is done (its backward ran before this scheduled call): that was its cost
            if turn.first_charge:  # the first call's: spread the turns, the k-th of n due after (k + 1) / n
                turn.first_charge = False
                turn.credit_ns += turn.spent_ns * (1 - (turn.index + 1) / len(self._turns))
            turn.cost_ns, turn.spent_ns = turn.spent_ns, 0.0
        if self.share is not None and call != 1:
            # Pieces not asked for a while (a graph compiled again, an evaluation graph between evaluations) are
            # left out of the sum until they are asked again: their costs would slow every live piece's turns.
            # Each piece's latest complete turn: one taken on this call is under way (its last is `cost_ns`); the
            # others' last turn is done, its cost not moved to `cost_ns` until they are asked (`check.CheckedCalls`
            # charges it after the call).
            live = now - self.STALE_NS
            total = sum(t.cost_ns if t.taken == call else t.spent_ns or t.cost_ns
                        for t in self._turns if t.accrued_at >= live or t is turn)
            if total > 0:
                earned = self.share * (now - turn.accrued_at) * turn.cost_ns / total
                turn.credit_ns = min(0.0, turn.credit_ns + earned)
        turn.accrued_at = now
        if self.share is None or call == 1 or turn.credit_ns >= 0:
            turn.taken = call
            return True
        turn.passed_over += 1
        return False


@dataclasses.dataclass(eq=False)
class Turn:
    """One piece's part of `Turns`: its credit (ns it may spend; it takes a scheduled call when not below zero),
    what its last turn cost, what its current one has spent so far, and the scheduled calls it passed over."""

    turns: Turns
    index: int
    credit_ns: float = 0.0
    cost_ns: float = 0.0
    spent_ns: float = 0.0
    accrued_at: int = 0
    passed_over: int = 0
    first_charge: bool = True
    depth: int = 0
    taken: int = 0  # the last scheduled call it took
    # all it spent in its blocks, and all it was charged afterwards (`charge`), over the run: for benchmarks
    blocks_total_ns: float = 0.0
    charged_total_ns: float = 0.0

    def take(self, call: int) -> bool:
        """Whether the piece takes scheduled call `call` (accrues its credit, charges its last turn's cost)."""
        return self.turns._take(self, call)

    @contextlib.contextmanager
    def spending(self) -> Iterator[None]:
        """A block of this piece's turn: its wall time is the turn's cost (a block inside another counts once)."""
        self.depth += 1
        start = self.turns.counter() if self.depth == 1 else None
        try:
            yield
        finally:
            self.depth -= 1
            if start is not None:
                spent = self.turns.counter() - start
                self.spent_ns += spent
                self.credit_ns -= spent
                self.blocks_total_ns += spent

    def charge(self, ns: float) -> None:
        """What this piece's turn cost, measured after it ended (where no `spending` block could hold it)."""
        self.spent_ns += ns
        self.credit_ns -= ns
        self.charged_total_ns += ns


class OrdinaryPeriods:
    """The periods (host wall time from a call's start to the graph's next call) of a graph's last few ordinary
    calls: neither timed nor checked, nor the first. Their median is what a call costs without either, against
    which a timed or checked call's period is charged (`sampler.TimedCalls`, `check.CheckedCalls`)."""

    RECENT = 5

    def __init__(self):
        self._recent_ms: list[float] = []

    def add(self, period_ms: float) -> None:
        self._recent_ms.append(period_ms)
        if len(self._recent_ms) > self.RECENT:
            del self._recent_ms[0]

    def excess_ms(self, period_ms: float) -> float | None:
        """What `period_ms` lasted beyond an ordinary call (never below 0); None while no ordinary period is known."""
        if not self._recent_ms:
            return None
        return max(period_ms - statistics.median(self._recent_ms), 0.0)
