"""Timing one sampled call of a graph or a split: clock marks around its forward, and gradient hooks that mark the
start and end of its backward. Marks are read later (see `timing`); nothing here waits for the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import Phase
from thunderfx_debug.recording.host import HostWatch
from thunderfx_debug.recording.timing import DeviceHold, RegionTimer, SampleSeries
from thunderfx_debug.recording.turns import OrdinaryPeriods, Turn
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import torch_private


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
    """Marks the backward of one sampled call of a piece (graph or split) with hooks on the piece's own autograd
    nodes: start just before the first of them runs (pre-hooks on the outputs' `grad_fn`), end once every node that
    passes gradients to the piece's inputs has run (post-hooks). Hooks on the input tensors would end too late: an
    input's gradient is complete only when every consumer of it ran its backward (a tied embedding weight waits for
    the other graph's backward). Hooks are removed as soon as the end fired, or by `cancel()`.

    The start also arms the sampler's `regions` (fusion-level timing of a thunder split) for this call's backward,
    so that its instrumented backward trace records the fusion regions of exactly this call; the end (or `cancel()`)
    disarms it. With the sampler's `hold`, the start first holds the device back (once per call, whichever piece
    starts first), and where the sampler owns the hold the end tells it how long the host took.

    The hooks run inside the user's `backward()`: a failure in them goes to the sampler's failures (logged, never
    raised into the backward unless strict), and the gradient always passes unchanged."""

    def __init__(self, sampler: PhaseSampler, call: int, inputs: Sequence[Any], outputs: Sequence[torch.Tensor]):
        self.sampler, self.call = sampler, call
        self.start = self.host = None
        self.handles: list[Any] = []
        first_nodes, last_nodes = backward_nodes(inputs, outputs)
        if not first_nodes or not last_nodes:
            return
        self._ends_left = len(last_nodes)
        try:
            for node in first_nodes:
                self.handles.append(node.register_prehook(self._on_start))
            for node in last_nodes:
                self.handles.append(node.register_hook(self._on_node_done))
        except BaseException:
            self.cancel()  # no half-registered hooks left behind on the user's autograd graph
            raise

    def _on_start(self, grad_outputs):
        sampler = self.sampler
        with sampler.failures.guard(f"marking the start of the backward of {sampler.label}"):
            if self.start is None:
                if sampler.hold is not None:
                    sampler.hold.begin(Phase.BACKWARD, self.call)
                if sampler.watch is not None:
                    self.host = sampler.watch.begin()
                self.start = sampler.backward.clock.mark()
                if sampler.regions is not None:
                    sampler.regions.backward_call = self.call
        return None  # the gradients pass unchanged

    def _on_node_done(self, grad_inputs, grad_outputs):
        self._ends_left -= 1
        if self._ends_left > 0:
            return
        sampler = self.sampler
        try:
            with sampler.failures.guard(f"marking the end of the backward of {sampler.label}"):
                if self.start is not None:
                    sampler.backward.add(self.call, self.start, sampler.backward.clock.mark())
                    if self.host is not None:
                        sampler.watch.end(self.host, self.call, Phase.BACKWARD)
                    if sampler.hold is not None and sampler.owns_hold:
                        sampler.hold.end(Phase.BACKWARD)
        finally:
            self.cancel()

    def cancel(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        regions = self.sampler.regions
        if regions is not None and regions.backward_call == self.call:
            regions.disarm_backward()


def backward_nodes(inputs: Sequence[Any], outputs: Sequence[torch.Tensor], limit: int = 10_000) -> tuple[list, list]:
    """The autograd nodes of a piece's backward: those of its outputs (run first), and those with an edge into the
    gradient node of an input (run last), found by walking from the outputs until the inputs. A walk that does not
    end within `limit` nodes (the inputs are not a cut of the graph) gives no nodes: no backward sample this call.

    An input that is a leaf (a parameter) is known in the walk by its gradient accumulator's `variable`, rather than
    by asking `get_gradient_edge` for its node, which makes a view of the leaf to find it: 6.8 µs a leaf against
    0.14 on the H200 (benchmarks/cuda_call_costs.py), and a graph or an MoE's split takes dozens of parameters."""
    input_nodes, leaves = {}, set()
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            if t.grad_fn is None:
                leaves.add(id(t))  # the inputs live through the call, so their ids stay theirs
            else:
                input_nodes[id(t.grad_fn)] = t.grad_fn  # kept alive, so the node's id stays its own
    first = {}
    for t in outputs:
        if t.grad_fn is not None and id(t.grad_fn) not in input_nodes:
            first.setdefault(id(t.grad_fn), t.grad_fn)  # an output that is an input passed through is not ours
    if not (input_nodes or leaves) or not first:
        return [], []
    accumulator = torch_private.gradient_accumulator_type()
    seen, last, stack = {}, [], list(first.values())
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        if len(seen) >= limit:
            return [], []
        seen[id(node)] = node
        feeds_an_input = False
        for next_node, _ in node.next_functions:
            if next_node is None:
                continue
            if id(next_node) in input_nodes or (type(next_node) is accumulator and id(next_node.variable) in leaves):
                feeds_an_input = True
            else:
                stack.append(next_node)
        if feeds_an_input:
            last.append(node)
    return list(first.values()), last
