"""What runs on the training path: the callable the backend hands Dynamo for each graph, and the wrapper of each
split inside it.

Unsampled calls pay a counter, a comparison and a Python call per split. Sampled calls add clock marks before and
after, and gradient hooks that mark the start and end of the backward; marks are read later (see `timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.safety import ReportingFailures
from thunderfx_debug.timing import DeviceHold, RegionTimer, SampleSeries, Sampling


class BackwardMarks:
    """Marks the backward of one sampled call of a piece (graph or split) with hooks on the piece's own autograd
    nodes: start just before the first of them runs (pre-hooks on the outputs' `grad_fn`), end once every node that
    passes gradients to the piece's inputs has run (post-hooks). Hooks on the input tensors would end too late: an
    input's gradient is complete only when every consumer of it ran its backward (a tied embedding weight waits for
    the other graph's backward). Hooks are removed as soon as the end fired, or by `cancel()`.

    With `regions` (fusion-level timing of a thunder split), the start also arms the split's `RegionTimer` for this
    call's backward, so that its instrumented backward trace records the fusion regions of exactly this call; the
    end (or `cancel()`) disarms it. With `hold` (a graph timed at fusion level on CUDA), the start first holds the
    device back (see `timing.DeviceHold`; once per call, whichever piece starts first), and with `hold_owner` (the
    graph) the end tells the hold how long the host took.

    The hooks run inside the user's `backward()`: a failure in them goes to `failures` (logged, never raised into
    the backward unless strict), and the gradient always passes unchanged."""

    def __init__(
        self,
        series: SampleSeries,
        call: int,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        regions: RegionTimer | None = None,
        failures: ReportingFailures | None = None,
        label: str = "a piece",
        hold: DeviceHold | None = None,
        hold_owner: bool = True,
    ):
        self.series, self.call = series, call
        self.regions = regions
        self.hold, self.hold_owner = hold, hold_owner
        self.failures = failures or ReportingFailures(strict=True)
        self.label = label
        self.start = None
        self.handles: list[Any] = []
        first_nodes, last_nodes = _backward_nodes(inputs, outputs)
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
        with self.failures.guard(f"marking the start of the backward of {self.label}"):
            if self.start is None:
                if self.hold is not None:
                    self.hold.begin("backward", self.call)
                self.start = self.series.clock.mark()
                if self.regions is not None:
                    self.regions.backward_call = self.call
        return None  # the gradients pass unchanged

    def _on_node_done(self, grad_inputs, grad_outputs):
        self._ends_left -= 1
        if self._ends_left > 0:
            return
        try:
            with self.failures.guard(f"marking the end of the backward of {self.label}"):
                if self.start is not None:
                    self.series.add(self.call, self.start, self.series.clock.mark())
                    if self.hold is not None and self.hold_owner:
                        self.hold.end("backward")
        finally:
            self.cancel()

    def cancel(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.regions is not None and self.regions.backward_call == self.call:
            self.regions.disarm_backward()


def _backward_nodes(inputs: Sequence[Any], outputs: Sequence[Any], limit: int = 10_000) -> tuple[list, list]:
    """The autograd nodes of a piece's backward: those of its outputs (run first), and those with an edge into the
    gradient node of an input (run last), found by walking from the outputs until the inputs. A walk that does not
    end within `limit` nodes (the inputs are not a cut of the graph) gives no nodes: no backward sample this call."""
    from torch.autograd.graph import get_gradient_edge

    input_nodes = {}
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            node = get_gradient_edge(t).node
            input_nodes[id(node)] = node  # the node objects are kept alive, so their ids stay theirs
    first = {}
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.grad_fn is not None and id(t.grad_fn) not in input_nodes:
            first.setdefault(id(t.grad_fn), t.grad_fn)  # an output that is an input passed through is not ours
    if not input_nodes or not first:
        return [], []
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
            if id(next_node) in input_nodes:
                feeds_an_input = True
            else:
                stack.append(next_node)
        if feeds_an_input:
            last.append(node)
    return list(first.values()), last


def _flat_tensors(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _flat_tensors(v)]
    return []


class TimedPiece:
    """The sampling state of one graph or split: which call is current and the pending backward hooks.

    `regions` is the RegionTimer of a thunder split timed at fusion level (see `fusion_timing`): it is armed with
    the call number around the forward of each sampled call, and for that call's backward by `BackwardMarks`.

    The bookkeeping around `fn` is guarded by `failures`: a failing clock or hook loses that sample (logged once),
    while `fn` itself runs exactly once and its exceptions are the user's, raised as they are.

    `hold` (a graph timed at fusion level on CUDA) holds the device back before the first mark of each sampled
    forward and backward, so that its marks and those of the splits and regions inside time device work. The graph
    owns it (`hold_owner`); its splits share it so that a split's backward start, which autograd may run before the
    graph's, also comes after the hold."""

    def __init__(
        self,
        forward: SampleSeries,
        backward: SampleSeries,
        regions: RegionTimer | None = None,
        failures: ReportingFailures | None = None,
        label: str = "a piece",
        hold: DeviceHold | None = None,
        hold_owner: bool = True,
    ):
        self.forward, self.backward = forward, backward
        self.regions = regions
        self.hold, self.hold_owner = hold, hold_owner
        self.failures = failures or ReportingFailures(strict=True)
        self.label = label
        self._backward_marks: BackwardMarks | None = None

    def run_sampled(self, fn: Callable, args: Sequence[Any], call: int) -> Any:
        regions = self.regions
        start = None
        with self.failures.guard(f"starting a timing sample of {self.label}"):
            if self._backward_marks is not None:  # the previous sample's backward never ran (e.g. an eval step)
                self._backward_marks.cancel()
                self._backward_marks = None
            # Reading earlier samples whose events are complete costs no synchronisation (`Event.query`).
            self.forward.resolve()
            self.backward.resolve()
            if regions is not None:
                regions.forward_call = call
            if self.hold is not None and self.hold_owner:
                self.hold.begin("forward", call)
            start = self.forward.clock.mark()
        try:
            out = fn(*args)
        finally:
            if regions is not None:
                regions.forward_call = 0
        with self.failures.guard(f"ending a timing sample of {self.label}"):
            if start is not None:
                self.forward.add(call, start, self.forward.clock.mark())
                if self.hold is not None and self.hold_owner:
                    self.hold.end("forward")
            self._backward_marks = BackwardMarks(
                self.backward, call, args, _flat_tensors(out), regions, self.failures, self.label, self.hold,
                self.hold_owner,
            )
        return out


class SplitRunner(torch.nn.Module):
    """Stands in for a thunder_N / inductor_N submodule of the split graph: counts calls, times sampled ones, and
    notes a failure of the split before it propagates (so the report can say which piece failed)."""

    def __init__(self, inner: Callable, split_state, graph_state, sampling: Sampling, timed: bool,
                 hold: DeviceHold | None = None):
        super().__init__()
        self.inner = inner
        self._split, self._graph = split_state, graph_state
        self._sampling = sampling
        # Set by the backend when THUNDERFX_DEBUG_INPUTS=real: `first_call(split_state, args, inner)` runs the first
        # call itself, keeping host copies of its inputs and outputs for the repro scripts.
        self.first_call: Callable | None = None
        self._timed = None
        if timed:
            label = f"{graph_state.name}/{split_state.name}"
            self._timed = TimedPiece(split_state.forward, split_state.backward, None, graph_state.failures, label,
                                     hold, hold_owner=False)

    def attach_regions(self, regions: RegionTimer) -> None:
        """Times the fusion regions of this (thunder) split on its sampled calls; needs split-level timing."""
        if self._timed is None:
            raise ValueError(f"{self._split.name} is not timed, so its fusion regions cannot be: fusion-level timing "
                             "needs split-level timing")
        self._timed.regions = regions

    def forward(self, *args):
        split = self._split
        split.calls += 1
        try:
            if split.calls == 1 and self.first_call is not None:
                return self.first_call(split, args, self.inner)
            if self._timed is not None and self._sampling.is_sampled(self._graph.calls):
                return self._timed.run_sampled(self.inner, args, self._graph.calls)
            return self.inner(*args)
        except Exception as e:
            from thunderfx_debug.recorder import describe_exception

            split.error = describe_exception(e)
            self._graph.failed_piece = split.name
            raise


class GraphRunner:
    """The callable returned to Dynamo for one graph."""

    def __init__(self, backend, state, split_gm: torch.fx.GraphModule, sampling: Sampling, timed: bool,
                 hold: DeviceHold | None = None):
        self.backend, self.state, self.split_gm = backend, state, split_gm
        self.sampling = sampling
        self._timed = TimedPiece(state.forward, state.backward, None, state.failures, state.name, hold) if timed else None
        self._fallback: Callable | None = None

    def __call__(self, *args):
        state = self.state
        state.calls += 1
        if self._fallback is not None:
            return self._fallback(*args)
        if state.calls == 1:
            self.backend._on_first_call(state, args)
        try:
            if self._timed is not None and self.sampling.is_sampled(state.calls):
                return self._timed.run_sampled(self.split_gm, args, state.calls)
            out = self.split_gm(*args)
            if state.calls == 1:
                self.backend._on_first_output(state, out)
            return out
        except Exception as e:
            self._fallback = self.backend._on_graph_error(state, e, args)
            return self._fallback(*args)
