"""Compile cost as the user feels it: the host wall time of a graph's (and each split's) first forward and first
backward, beside the backend call, split into the parts that can be told apart (`records.CostStage`).

Thunder, nvFuser and inductor do most of their compiling at a graph's first call, not in the backend call: Thunder
traces and transforms a split at its first call, Thunder's torch.compile regions and inductor's lazily compiled
backward compile at their first execution, nvFuser compiles each fusion at its first execution, and (Thunder <=
0.2.6, see `thunder.workarounds.LazyInductorModule`) inductor splits compile at their first call. So the first call
of each graph and split is timed on the host clock (`FirstCallTimer`), forward and backward, whatever the sampling;
Thunder's compile stats are read right after a split's first call; Dynamo's compile callbacks (`SPANS`) say which
compiles ran inside those windows. `graph_cost` and `split_cost` turn that into records at snapshot time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from thunderfx_debug.records import CompileCost, CostPart, CostStage, CostWhen, SplitKind
from thunderfx_debug.recording.sampler import PhaseSampler
from thunderfx_debug.recording.timing import HostClock, SampleSeries
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import compile_events
from thunderfx_debug.thunder.compile_events import CompileSpans, FirstCallStats
from thunderfx_debug.thunder.workarounds import lazy_inductor_compile_seconds


class StampSeries(SampleSeries):
    """A host-clock series that also keeps the (start, end) perf_counter_ns stamps of its samples."""

    def __init__(self):
        super().__init__(HostClock())
        self.stamps: list[tuple[int, int]] = []

    def add(self, call: int, start: Any, end: Any) -> None:
        self.stamps.append((start, end))
        super().add(call, start, end)

    def window(self) -> tuple[int, int] | None:
        return self.stamps[0] if self.stamps else None


@dataclasses.dataclass
class FirstCall:
    """What the host saw of a piece's first call: the forward's and backward's windows, Thunder's compile stats of a
    thunder split, and the seconds inductor took to compile an inductor split lazily."""

    forward: StampSeries = dataclasses.field(default_factory=StampSeries)
    backward: StampSeries = dataclasses.field(default_factory=StampSeries)
    stats: FirstCallStats | None = None
    inductor_compile_s: float | None = None


class FirstCallTimer:
    """Times the first call of a graph or split on the host clock: its forward around the call, its backward with
    the gradient hooks of `sampler.BackwardMarks`. `compiled` is the split's Thunder module or inductor callable,
    whose compile facts are read right after the call (None for a graph)."""

    def __init__(self, label: str, failures: ReportingFailures, kind: SplitKind | None = None, compiled: Any = None):
        self.first = FirstCall()
        self._sampler = PhaseSampler(f"the first call of {label}", self.first.forward, self.first.backward, failures)
        self._label, self._failures, self._kind, self._compiled = label, failures, kind, compiled

    def run(self, fn: Callable, args: Sequence[Any]) -> Any:
        out = self._sampler.run(fn, args, call=1)
        if self._kind is not None:
            with self._failures.guard(f"reading the compile stats of {self._label}"):
                if self._kind is SplitKind.THUNDER:
                    self.first.stats = compile_events.first_call_stats(self._compiled)
                else:
                    self.first.inductor_compile_s = lazy_inductor_compile_seconds(self._compiled)
        return out


def _run_s(ns: int, origin_ns: int) -> float:
    return (ns - origin_ns) / 1e9


def _compiles_s(spans: CompileSpans, window: tuple[int, int] | None) -> float:
    return sum(s.seconds for s in spans.within(*window)) if window else 0.0


def _span_s(window: tuple[int, int] | None) -> float | None:
    return None if window is None else (window[1] - window[0]) / 1e9


def _ended(first: FirstCall, origin_ns: int) -> float | None:
    window = first.backward.window() or first.forward.window()
    return None if window is None else _run_s(window[1], origin_ns)


def _backward_parts(first: FirstCall, spans: CompileSpans) -> list[CostPart]:
    window = first.backward.window()
    if window is None:
        return []
    compiles = _compiles_s(spans, window)
    parts = [CostPart(CostWhen.BACKWARD, CostStage.KERNEL_COMPILES, compiles)] if compiles else []
    return parts + [CostPart(CostWhen.BACKWARD, CostStage.FIRST_EXECUTION, max(_span_s(window) - compiles, 0.0))]


def split_cost(first: FirstCall | None, kind: SplitKind, origin_ns: int, spans: CompileSpans) -> CompileCost | None:
    """The compile cost of a split from its first call (None before it ran): see `records.CostStage`."""
    if first is None or first.forward.window() is None:
        return None
    window = first.forward.window()
    forward_s = _span_s(window)
    compiles = _compiles_s(spans, window)
    parts: list[CostPart] = []
    if kind is SplitKind.THUNDER and first.stats is not None:
        stats = first.stats
        parts += [CostPart(CostWhen.FORWARD, CostStage.THUNDER_TRACING, stats.tracing_s),
                  CostPart(CostWhen.FORWARD, CostStage.THUNDER_TRANSFORMS, stats.transforms_s)]
        in_execution = _compiles_s(spans, (stats.execution_start_ns, stats.execution_end_ns))
        if compiles:
            parts.append(CostPart(CostWhen.FORWARD, CostStage.KERNEL_COMPILES, compiles))
        parts.append(CostPart(CostWhen.FORWARD, CostStage.FIRST_EXECUTION, max(stats.execution_s - in_execution, 0.0)))
    else:
        lazy = first.inductor_compile_s or 0.0
        if lazy:
            parts.append(CostPart(CostWhen.FORWARD, CostStage.INDUCTOR_COMPILE, lazy))
        if compiles:
            parts.append(CostPart(CostWhen.FORWARD, CostStage.KERNEL_COMPILES, compiles))
        parts.append(CostPart(CostWhen.FORWARD, CostStage.FIRST_EXECUTION, max(forward_s - lazy - compiles, 0.0)))
    parts += _backward_parts(first, spans)
    return CompileCost(forward_s=forward_s, backward_s=_span_s(first.backward.window()), parts=tuple(parts),
                       started_s=_run_s(window[0], origin_ns), ended_s=_ended(first, origin_ns))


@dataclasses.dataclass
class BackendCall:
    """The backend call of a graph (perf_counter_ns), and the start of the Dynamo compile it was part of."""

    started_ns: int
    ended_ns: int
    dynamo_started_ns: int | None


def graph_cost(first: FirstCall | None, backend: BackendCall | None, origin_ns: int,
               spans: CompileSpans) -> CompileCost | None:
    """The compile cost of a graph: Dynamo's compile of its frame and the backend call, then the wall time of its
    first forward and backward (the parts inside those are its splits')."""
    if backend is None:
        return None
    backend_s = (backend.ended_ns - backend.started_ns) / 1e9
    parts = [CostPart(CostWhen.COMPILE, CostStage.BACKEND, backend_s)]
    started_ns = backend.started_ns
    dynamo = spans.starting_at(backend.dynamo_started_ns) if backend.dynamo_started_ns is not None else None
    if dynamo is not None and dynamo.end_ns >= backend.ended_ns:
        parts.insert(0, CostPart(CostWhen.COMPILE, CostStage.DYNAMO, max(dynamo.seconds - backend_s, 0.0)))
        started_ns = dynamo.start_ns
    forward = first.forward.window() if first is not None else None
    return CompileCost(
        forward_s=_span_s(forward),
        backward_s=_span_s(first.backward.window()) if first is not None else None,
        parts=tuple(parts),
        started_s=_run_s(started_ns, origin_ns),
        ended_s=_ended(first, origin_ns) if first is not None and forward is not None
        else _run_s(backend.ended_ns, origin_ns),
    )

