"""torch's structured trace log (TORCH_TRACE), which tlparse turns into a page per compile id: writing artifacts into
it under the compile id of one Dynamo graph. Reads torch internals (torch._logging, torch._guards; torch 2.5 to
2.13), so it lives here with the other Dynamo readings.

tlparse files an artifact under the compile that is in progress when it is logged (Dynamo's CompileContext of the
thread). During the backend's call that is the graph's own compile; later (after a graph's first call, at flush) no
compile is in progress, so the graph's context is entered again, attempt included, for the one log call: the
artifact then lands in the graph's folder beside Dynamo's own artifacts (`-_0_0_0/`, where an explicit `compile_id`
argument would give the attempt-less `-_0_0_-/`). While another compile is in progress on the thread (Thunder's
torch.compile of a TorchCompile region, or another graph's), nothing is written: it would be filed under that compile.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from torch._guards import CompileContext, CompileId, TraceId, compile_context
from torch._logging import trace_structured

PREFIX = "thunderfx_debug_"


def tracing_enabled() -> bool:
    """torch's own answer to "is TORCH_TRACE on": its trace handler is installed with a directory to write to
    (TORCH_TRACE, TORCH_DTRACE or TORCH_COMPILE_DEBUG=1, as torch read them when it set up its logs). Outside Meta's
    fbcode, torch's handler without a directory removes itself at the first record and writes nothing."""
    try:
        from torch._logging import _internal
    except ImportError:
        return False
    handler = getattr(_internal, "LOG_TRACE_HANDLER", None)
    return (handler is not None and handler in _internal.trace_log.handlers
            and getattr(handler, "root_dir", None) is not None)


def current_trace_id() -> TraceId | None:
    """The compile in progress on this thread (compile id and attempt), None outside a compile."""
    return CompileContext.current_trace_id()


def trace_id_of(compile_id: str | None) -> TraceId | None:
    """A trace id from a recorded compile id ("0/0"), first attempt: for a graph whose compile was not seen."""
    parsed = CompileId.from_string(compile_id) if compile_id else None
    return TraceId(parsed, 0) if parsed is not None else None


def artifact_name(*parts: str) -> str:
    """"thunderfx_debug_graph0_thunder_0_fwd_trace": tlparse makes file names of artifact names, so only
    [A-Za-z0-9_.-] stays (anything else becomes "_").

    Example:
        >>> artifact_name("graph0", "thunder_0", "fwd_trace"), artifact_name("graph0", "a/b c")
        ('thunderfx_debug_graph0_thunder_0_fwd_trace', 'thunderfx_debug_graph0_a_b_c')
    """
    return PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", "_".join(parts))


@contextlib.contextmanager
def _within(trace_id: TraceId) -> Iterator[None]:
    """Dynamo's compile context of `trace_id` as the current one, for logging only (no compile runs in it)."""
    if current_trace_id() == trace_id:
        yield
        return
    context = CompileContext(trace_id.compile_id)
    context.attempt = trace_id.attempt
    with compile_context(context):
        yield


def emit(name: str, payload: str, trace_id: TraceId | None, encoding: str = "string") -> bool:
    """Writes one artifact into the trace log, under `trace_id`'s compile (None: under no compile id). `encoding` is
    "string" (shown as text) or "json" (`payload` is JSON text). Returns False, having written nothing, while another
    compile is in progress on this thread."""
    current = current_trace_id()
    if current is not None and current != trace_id:
        return False
    context = _within(trace_id) if trace_id is not None else contextlib.nullcontext()
    with context:
        trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": name, "encoding": encoding},
            payload_fn=lambda: payload,
            expect_trace_id=trace_id is not None,  # without one, no stack of this call is recorded
            record_logging_overhead=False,  # not Dynamo's compile time
        )
    return True
