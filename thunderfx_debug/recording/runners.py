"""What runs on the training path: the callable the backend hands Dynamo for each graph, and the stand-in of each
split inside it.

Unsampled calls pay a counter, a comparison and a Python call per split, and, with a dump directory, one clock
reading per graph call for the periodic flush (`periodic`). Sampled calls add clock marks before and after, and
gradient hooks that mark the start and end of the backward (see `sampler`). The first call of a graph
and of each split also keeps host copies of its inputs and outputs when the run asks for real inputs (`capture`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from thunderfx_debug.recording.sampler import PhaseSampler
from thunderfx_debug.recording.timing import RegionTimer, Sampling
from thunderfx_debug.safety import describe_exception

if TYPE_CHECKING:
    from thunderfx_debug.recording.capture import InputCapture
    from thunderfx_debug.recording.periodic import PeriodicFlush
    from thunderfx_debug.recording.recorder import GraphState, SplitState


class GraphErrorHandler(Protocol):
    def __call__(self, state: GraphState, error: BaseException, args: tuple) -> Callable:
        """Records that Thunder failed on a graph, then raises `error` again or returns what runs the graph from
        now on (THUNDERFX_DEBUG_ON_ERROR)."""


class SplitRunner(torch.nn.Module):
    """Stands in for a thunder_N / inductor_N submodule of the split graph: counts calls, times sampled ones, keeps
    the first call's inputs and outputs (with `capture`), and notes a failure of the split before it propagates (so
    the report can say which split failed).

    An nn.Module because the split graph holds its splits as submodules, with the split itself as its child `inner`.
    It is called directly (`__call__` is `forward`) and reaches the split through an instance attribute, because
    the split graph calls it on every step, and nn.Module's hook dispatch and submodule lookup cost about a
    microsecond a call.
    """

    def __init__(self, inner: Callable, split: SplitState, graph: GraphState, sampling: Sampling,
                 sampler: PhaseSampler | None, capture: InputCapture | None):
        super().__init__()
        self.inner = inner
        self.__dict__["_inner"] = inner  # beside the registered child: a plain lookup on the call path
        self._split, self._graph = split, graph
        self._sampling, self._sampler, self._capture = sampling, sampler, capture

    def attach_regions(self, regions: RegionTimer) -> None:
        """Times the fusion regions of this (thunder) split on its sampled calls; needs split-level timing."""
        if self._sampler is None:
            raise ValueError(f"{self._split.name} is not timed, so its fusion regions cannot be: fusion-level timing "
                             "needs split-level timing")
        self._sampler.regions = regions

    def forward(self, *args):
        split, graph = self._split, self._graph
        split.calls += 1
        first = split.calls == 1 and self._capture is not None
        if first:
            self._capture.inputs(split, args)
        try:
            if self._sampler is not None and self._sampling.is_sampled(graph.calls):
                out = self._sampler.run(self._inner, args, graph.calls)
            else:
                out = self._inner(*args)
        except Exception as e:
            split.error = describe_exception(e)
            graph.failed_split = split.name
            raise
        if first:
            self._capture.outputs(split, out)
        return out

    __call__ = forward


class GraphRunner:
    """The callable returned to Dynamo for one graph: counts calls, times sampled ones, keeps the first call's
    inputs and outputs (with `capture`), runs `after_first_call(state)` once the first call has returned, hands
    a failure to `on_error`, whose answer runs the graph from then on, and after each call starts the periodic
    flush when it is due (`periodic`; None: no periodic flushes)."""

    def __init__(self, state: GraphState, split_gm: torch.fx.GraphModule, sampling: Sampling,
                 sampler: PhaseSampler | None, capture: InputCapture | None, on_error: GraphErrorHandler,
                 after_first_call: Callable[[GraphState], None] | None = None,
                 periodic: PeriodicFlush | None = None):
        self.state, self.split_gm = state, split_gm
        self._sampling, self._sampler, self._capture = sampling, sampler, capture
        self._on_error = on_error
        self._fallback: Callable | None = None
        self._after_first_call = after_first_call
        self._periodic = periodic

    def __call__(self, *args):
        state = self.state
        state.calls += 1
        if self._fallback is not None:
            out = self._fallback(*args)
        else:
            first = state.calls == 1
            if first and self._capture is not None:
                self._capture.inputs(state, args)
            try:
                if self._sampler is not None and self._sampling.is_sampled(state.calls):
                    out = self._sampler.run(self.split_gm, args, state.calls)
                else:
                    out = self.split_gm(*args)
            except Exception as e:
                self._fallback = self._on_error(state, e, args)
                out = self._fallback(*args)
            else:
                if first:
                    if self._capture is not None:
                        self._capture.outputs(state, out)
                    if self._after_first_call is not None:
                        self._after_first_call(state)
        periodic = self._periodic
        if periodic is not None and periodic.clock() >= periodic.due_at:
            periodic.fire()  # between two graph calls of the training thread (see `periodic`)
        return out
