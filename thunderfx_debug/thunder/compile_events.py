"""What the process compiles and when, as Dynamo and Thunder report it: Dynamo's compile callbacks (start and end of
every outermost compile: a frame, a torch.compile region inside Thunder, inductor's lazy backward), Thunder's compile
stats of a split's last call, and inductor's cache counters.

Dynamo internals (torch 2.11 to 2.13): `torch._dynamo.callback.callback_handler` runs its start callbacks when the
outermost compile of the process starts (`install_callbacks`, used by `convert_frame` with trigger DYNAMO and by
AOTAutograd's lazy backward with LAZY_BACKWARD) and its end callbacks when it ends; `torch._dynamo.reset()` clears
the callbacks, so `CompileSpans.install()` is called again by each backend call. `torch._dynamo.utils.counters`
holds inductor's FX graph cache and AOTAutograd's cache hits and misses.

Thunder internals (0.2.6, thunder/__init__.py): `thunder.compile_stats(module)` holds perf_counter_ns stamps of the
module's last call, overwritten by every call: `last_trace_host_start/stop` around the whole call,
`last_trace_tracing_start/stop` around the interpreter (cache misses only), `last_prologue_transformation_start/stop`
and, up to `last_prologue_execution_start`, the computation transforms (autodiff, fusion passes, the
forward/backward split, code generation, our own post-optimization transform), and
`last_trace_host_execution_start/stop` around the computation function. Nothing there covers the backward.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

#: Spans kept by the process-wide listener: compiles are rare (a few per graph), so this bounds only pathological runs.
MAX_SPANS = 10_000


@dataclasses.dataclass(frozen=True)
class CompileSpan:
    """One outermost compile that Dynamo reported: `trigger` "DYNAMO" (a frame, incl. a torch.compile inside a
    Thunder region) or "LAZY_BACKWARD" (AOTAutograd compiling a backward at its first run); perf_counter_ns stamps."""

    trigger: str
    compile_id: str
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class CompileSpans:
    """The process-wide record of Dynamo's compiles (one instance, `SPANS`).

    `started` counts the compiles that started, so that a sampled call can tell cheaply whether the process
    compiled during it (read it before and after). `open_start_ns` is the start of the compile in progress (the one a
    backend call is part of), None outside compiles."""

    def __init__(self):
        self.spans: collections.deque[CompileSpan] = collections.deque(maxlen=MAX_SPANS)
        self.started = 0
        self.open_start_ns: int | None = None
        self._open: tuple[str, str, int] | None = None
        self._lock = threading.Lock()

    # ---- the callbacks ------------------------------------------------------------------------------------------
    def _on_start(self, args: Any = None) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            self.started += 1
            self._open = (_trigger(args), str(getattr(args, "compile_id", "") or ""), now)
            self.open_start_ns = now

    def _on_end(self, args: Any = None) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            if self._open is not None:
                trigger, compile_id, start = self._open
                self.spans.append(CompileSpan(trigger, compile_id, start, now))
            self._open, self.open_start_ns = None, None

    def install(self) -> bool:
        """Registers the callbacks with Dynamo unless they are registered (after `torch._dynamo.reset()` they are
        not). False where this torch has no compile callbacks."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return False
        if self._on_start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._on_start)
        if self._on_end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._on_end)
        return True

    # ---- reading ------------------------------------------------------------------------------------------------
    def within(self, start_ns: int, end_ns: int) -> list[CompileSpan]:
        """The compiles that started and ended inside [start_ns, end_ns]."""
        with self._lock:
            return [s for s in self.spans if s.start_ns >= start_ns and s.end_ns <= end_ns]

    def starting_at(self, start_ns: int) -> CompileSpan | None:
        with self._lock:
            return next((s for s in self.spans if s.start_ns == start_ns), None)


def _trigger(args: Any) -> str:
    trigger = getattr(args, "callback_trigger", None)
    return getattr(trigger, "name", None) or str(trigger or "DYNAMO")


SPANS = CompileSpans()


@dataclasses.dataclass(frozen=True)
class FirstCallStats:
    """Thunder's own split of a module's first call (a cache miss), in seconds of host time."""

    tracing_s: float
    transforms_s: float
    execution_s: float
    execution_start_ns: int
    execution_end_ns: int


def _stats(module) -> Any:
    import thunder

    return thunder.compile_stats(module)


def first_call_stats(module) -> FirstCallStats | None:
    """Read right after a Thunder module's first call (which missed the cache and compiled): tracing, transforms and
    the first execution of its computation. None where the stamps are not those of a compile."""
    cs = _stats(module)
    if cs is None or cs.last_trace_tracing_start <= 0 or cs.last_prologue_execution_start <= 0:
        return None
    stamps = (cs.last_trace_tracing_start, cs.last_trace_tracing_stop, cs.last_prologue_transformation_start,
              cs.last_prologue_execution_start, cs.last_trace_host_execution_start, cs.last_trace_host_execution_stop)
    if any(b < a for a, b in zip(stamps, stamps[1:])):  # not one call's stamps (another thread, a newer Thunder)
        return None
    return FirstCallStats(
        tracing_s=(cs.last_trace_tracing_stop - cs.last_trace_tracing_start) / 1e9,
        transforms_s=(cs.last_prologue_execution_start - cs.last_prologue_transformation_start) / 1e9,
        execution_s=(cs.last_trace_host_execution_stop - cs.last_trace_host_execution_start) / 1e9,
        execution_start_ns=cs.last_trace_host_execution_start,
        execution_end_ns=cs.last_trace_host_execution_stop,
    )


def overhead_ns(module) -> int | None:
    """Read right after a call of a Thunder module: the host time of the call outside its computation function
    (cache check, prologue, autograd connection, epilogue), in ns; None where the stamps are not of one call."""
    cs = _stats(module)
    if cs is None:
        return None
    call = cs.last_trace_host_stop - cs.last_trace_host_start
    computation = cs.last_trace_host_execution_stop - cs.last_trace_host_execution_start
    if call <= 0 or computation < 0 or computation > call:
        return None
    return call - computation


#: inductor's and AOTAutograd's cache counters (process-wide) worth reporting, by the names torch counts them under.
CACHE_COUNTERS = {
    "fx graph cache": ("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot autograd cache": ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
}


def cache_counters() -> dict[str, dict[str, int]]:
    """Hits, misses and bypasses of inductor's FX graph cache and AOTAutograd's cache in this process so far, e.g.
    {"fx graph cache": {"hits": 3, "misses": 0, "bypasses": 0}, ...}. A cold cache makes first steps much slower."""
    from torch._dynamo.utils import counters

    result = {}
    for name, (group, hit, miss, bypass) in CACHE_COUNTERS.items():
        values = counters.get(group, {})
        result[name] = {"hits": int(values.get(hit, 0)), "misses": int(values.get(miss, 0)),
                        "bypasses": int(values.get(bypass, 0))}
    return result
