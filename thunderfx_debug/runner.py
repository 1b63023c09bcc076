"""What runs on the training path: the callable the backend hands Dynamo for each graph, and the wrapper of each
split inside it.

Unsampled calls pay a counter, a comparison and a Python call per split. Sampled calls add clock marks before and
after, and gradient hooks that mark the start and end of the backward; marks are read later (see `timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.timing import SampleSeries, Sampling


class BackwardMarks:
    """Marks the backward of one sampled call: start when the first output gradient arrives, end once the gradients
    of all inputs that need one are computed. Hooks are removed as soon as they fired, or by `cancel()`."""

    def __init__(self, series: SampleSeries, call: int, inputs: Sequence[Any], outputs: Sequence[Any]):
        self.series, self.call = series, call
        self.start = None
        self.handles: list[Any] = []
        grad_outputs = [t for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        grad_inputs = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if not grad_outputs or not grad_inputs:
            return
        for output in grad_outputs:
            self.handles.append(output.register_hook(self._on_output_grad))
        self.handles.append(torch.autograd.graph.register_multi_grad_hook(grad_inputs, self._on_inputs_done, mode="all"))

    def _on_output_grad(self, grad):
        if self.start is None:
            self.start = self.series.clock.mark()
        return None  # the gradient passes unchanged

    def _on_inputs_done(self, grads):
        if self.start is not None:
            self.series.add(self.call, self.start, self.series.clock.mark())
        self.cancel()

    def cancel(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _flat_tensors(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _flat_tensors(v)]
    return []


class TimedPiece:
    """The sampling state of one graph or split: which call is current and the pending backward hooks."""

    def __init__(self, forward: SampleSeries, backward: SampleSeries):
        self.forward, self.backward = forward, backward
        self._backward_marks: BackwardMarks | None = None

    def run_sampled(self, fn: Callable, args: Sequence[Any], call: int) -> Any:
        if self._backward_marks is not None:  # the previous sample's backward never ran (e.g. an eval step)
            self._backward_marks.cancel()
        # Reading earlier samples whose events are complete costs no synchronisation (`Event.query`).
        self.forward.resolve()
        self.backward.resolve()
        start = self.forward.clock.mark()
        out = fn(*args)
        self.forward.add(call, start, self.forward.clock.mark())
        self._backward_marks = BackwardMarks(self.backward, call, args, _flat_tensors(out))
        return out


class SplitRunner(torch.nn.Module):
    """Stands in for a thunder_N / inductor_N submodule of the split graph: counts calls, times sampled ones, and
    notes a failure of the split before it propagates (so the report can say which piece failed)."""

    def __init__(self, inner: Callable, split_state, graph_state, sampling: Sampling, timed: bool):
        super().__init__()
        self.inner = inner
        self._split, self._graph = split_state, graph_state
        self._sampling = sampling
        self._timed = TimedPiece(split_state.forward, split_state.backward) if timed else None
        # Set by the backend when THUNDERFX_DEBUG_INPUTS=real: `first_call(split_state, args, inner)` runs the first
        # call itself, keeping host copies of its inputs and outputs for the repro scripts.
        self.first_call: Callable | None = None

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

    def __init__(self, backend, state, split_gm: torch.fx.GraphModule, sampling: Sampling, timed: bool):
        self.backend, self.state, self.split_gm = backend, state, split_gm
        self.sampling = sampling
        self._timed = TimedPiece(state.forward, state.backward) if timed else None
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
