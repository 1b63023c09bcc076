"""The observers of one thunder split's fusion regions, called by its instrumented Thunder traces
(see `thunder.instrument`): fusion-level timing (`timing.RegionTimer`), and any other observer of the regions'
inputs and outputs. Each implements the four methods of `thunder.instrument.MARK_METHODS`."""

from __future__ import annotations

from collections.abc import Sequence


class RegionObservers:
    """Several observers of a split's traces as one: `begin_*` calls them in order, `end_*` in reverse order, so that
    an observer listed later brackets the work of those listed before it as little as possible: put the timer last,
    and its marks stand closest to the region.

    Example:
        >>> class Log:
        ...     def __init__(self, name, log): self.name, self.log = name, log
        ...     def begin_trace(self, phase): self.log.append(f"{self.name} begins {phase}")
        ...     def begin_region(self, key, *inputs): self.log.append(f"{self.name} before {key}{inputs}")
        ...     def end_region(self, key, *outputs): self.log.append(f"{self.name} after {key}{outputs}")
        ...     def end_trace(self, phase): self.log.append(f"{self.name} ends {phase}")
        >>> log = []
        >>> both = RegionObservers([Log("capture", log), Log("timer", log)])
        >>> both.begin_region("F0_forward", 1, 2); both.end_region("F0_forward", 3)
        >>> log
        ['capture before F0_forward(1, 2)', 'timer before F0_forward(1, 2)', 'timer after F0_forward(3,)', 'capture after F0_forward(3,)']
    """

    def __init__(self, observers: Sequence[object]):
        self.observers = list(observers)
        self._reversed = self.observers[::-1]
        # The regions' values are passed to the marks only where an observer reads them (see `thunder.instrument`).
        self.observes_values = any(getattr(o, "observes_values", True) for o in self.observers)
        marking = [o.mark_op for o in self.observers if hasattr(o, "mark_op")]
        # `mark_op` (before every op outside the regions, on every run) goes straight to the one observer that wants
        # it, without a loop in between.
        self.mark_op = marking[0] if len(marking) == 1 else self._mark_ops(marking)

    @staticmethod
    def _mark_ops(marking):
        def mark_op(symbol: str, executor: str) -> None:
            for mark in marking:
                mark(symbol, executor)

        return mark_op

    def begin_trace(self, phase: str) -> None:
        for observer in self.observers:
            observer.begin_trace(phase)

    def begin_region(self, key: str, *inputs) -> None:
        for observer in self.observers:
            observer.begin_region(key, *inputs)

    def end_region(self, key: str, *outputs) -> None:
        for observer in self._reversed:
            observer.end_region(key, *outputs)

    def end_trace(self, phase: str) -> None:
        for observer in self._reversed:
            observer.end_trace(phase)
