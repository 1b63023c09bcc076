"""The user's training steps, counted where torch can tell them: by the steps of its optimizers.

Per-step figures (the step's wall time, a piece's time per step, what a triaged piece loses per step) need the number
of training steps, which the graphs' calls do not give: a frame compiled again for a rare branch, an evaluation
graph or a logging graph is called less often than once per step. A `torch.optim.Optimizer` calls the process-wide
post-step hooks (`torch.optim.optimizer.register_optimizer_step_post_hook`) after each of its steps, so those steps
are counted there: per optimizer, from the first compile of the recording backend on, with the host wall time from
each step to the next (perf_counter), left out where the process compiled something in between (Dynamo's compile
callbacks, `thunder.compile_events.SPANS`). A step costs the hook a counter, a clock reading and a dict look-up
(about a microsecond): nothing touches the device. A run that steps no torch optimizer (inference, an optimizer of
its own) has no count, and the renderers say so (`render.digest.steps`).

One hook serves every live counter of the process (a weak set), so that a process that builds many backends (tests,
one backend per model) does not pile up hooks.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from thunderfx_debug.records import Steps
from thunderfx_debug.recording.host import host_series
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.compile_events import SPANS

_COUNTERS: weakref.WeakSet[StepCounter] = weakref.WeakSet()
_installed = False


@torch.compiler.disable  # a compiled optimizer step would otherwise run the hook once, while tracing, not per step
def _after_optimizer_step(optimizer, _args, _kwargs) -> None:
    for counter in tuple(_COUNTERS):
        counter.stepped(optimizer)


def _install() -> None:
    global _installed
    if not _installed:
        register_optimizer_step_post_hook(_after_optimizer_step)
        _installed = True


class _OptimizerSteps:
    __slots__ = ("count", "last_ns", "compiles", "period", "compiled")

    def __init__(self):
        self.count = 0
        self.last_ns = 0
        self.compiles = 0
        self.period = host_series()
        self.compiled = 0


class StepCounter:
    """Counts the optimizer steps taken once `start()` was called (at the run's first compile), until `stop()`.

    Example (a fake clock one millisecond per reading, no compile):
        >>> ticks = iter(range(0, 10**9, 1_000_000))
        >>> counter = StepCounter(ReportingFailures(strict=True), clock_ns=lambda: next(ticks))
        >>> optimizer = object()
        >>> counter.stepped(optimizer); counter.start()
        >>> for _ in range(3): counter.stepped(optimizer)
        >>> steps = counter.record(); steps.count, steps.period.samples_ms
        (3, (1.0, 1.0))
    """

    def __init__(self, failures: ReportingFailures, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 compiles: Callable[[], int] = lambda: SPANS.started):
        self._failures, self._clock_ns, self._compiles = failures, clock_ns, compiles
        # Keyed by the optimizer itself, held weakly: an id() of an optimizer the user let go is given to the next
        # object, and a new optimizer's steps would add to the old one's (seen: 4 + 6 steps counted as one
        # optimizer's 10). Every optimizer's steps stay in `_counted`, its count a figure of the run when it is gone.
        self._by_optimizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._by_id: dict[int, _OptimizerSteps] = {}  # an optimizer that takes no weak reference (__slots__)
        self._counted: list[_OptimizerSteps] = []
        self._started = self._stopped = False
        _install()
        _COUNTERS.add(self)

    def __getstate__(self) -> dict:
        # What it counted goes with a copy; the optimizers it holds weakly do not (nor are they copied).
        return {**self.__dict__, "_by_optimizer": weakref.WeakKeyDictionary(), "_by_id": {}}

    def __setstate__(self, state: dict) -> None:
        # A copy of the backend (Lightning deep-copies torch.compile's arguments) counts the steps of its own run.
        self.__dict__.update(state)
        _COUNTERS.add(self)

    def start(self) -> None:
        """The run began (its first compile): steps count from here on."""
        self._started = True

    def stepped(self, optimizer) -> None:
        """After a step of `optimizer` (the hook's call)."""
        if self._stopped or not self._started:
            return
        with self._failures.guard("counting an optimizer step"):
            now, compiles = self._clock_ns(), self._compiles()
            steps = self._steps_of(optimizer)
            steps.count += 1
            if steps.count > 1:
                if compiles == steps.compiles:
                    steps.period.add_measured(steps.count, (now - steps.last_ns) / 1e6)
                else:
                    steps.compiled += 1
            steps.last_ns, steps.compiles = now, compiles

    def _steps_of(self, optimizer) -> _OptimizerSteps:
        try:
            steps = self._by_optimizer.get(optimizer)
        except TypeError:  # no weak reference to it
            steps = self._by_id.get(id(optimizer))
        if steps is None:
            steps = _OptimizerSteps()
            self._counted.append(steps)
            try:
                self._by_optimizer[optimizer] = steps
            except TypeError:
                self._by_id[id(optimizer)] = steps
        return steps

    def stop(self) -> None:
        """No more steps are counted (the backend was closed)."""
        self._stopped = True
        _COUNTERS.discard(self)

    def record(self) -> Steps | None:
        """The steps of the optimizer stepped most often; None where none stepped."""
        counted = list(self._counted)  # a copy: the hook may add one
        if not counted:
            return None
        steps = max(counted, key=lambda s: s.count)
        return Steps(steps.count, len(counted), steps.period.timing(), steps.compiled)

