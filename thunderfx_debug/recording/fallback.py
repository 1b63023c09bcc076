"""What happens when Thunder fails on a graph, at compile or at a call (THUNDERFX_DEBUG_ON_ERROR)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from thunderfx_debug.recording.capture import InputCapture
from thunderfx_debug.recording.recorder import GraphState, Recorder
from thunderfx_debug.settings.config import OnError
from thunderfx_debug.settings.safety import describe_exception
from thunderfx_debug.thunder import torch_private

log = logging.getLogger("thunderfx_debug")


class GraphFailureHandler:
    """Records the failure (with the graph's inputs, for the repro of the failing piece), flushes the dump so that
    the failure report exists before anything else happens, then raises the error again (`OnError.RAISE`) or returns
    what runs the graph from now on: inductor, or eager where inductor fails too (`OnError.FALLBACK`).

    `flush` writes the dump (None: no dump directory)."""

    def __init__(self, recorder: Recorder, on_error: OnError, capture: InputCapture | None,
                 flush: Callable[[], object] | None):
        self.recorder, self.on_error, self.capture, self.flush = recorder, on_error, capture, flush

    def __call__(self, state: GraphState, error: BaseException, args) -> Callable:
        self.recorder.graph_failed(state, error)
        if state.captured is None and self.capture is not None:
            # Failed to compile: the inputs Dynamo handed the backend are the real ones.
            self.capture.inputs(state, args)
        state.fallback = self.on_error is OnError.FALLBACK  # before the flush, so that the dump says so
        if self.flush is not None:
            with self.recorder.failures.guard(f"writing the failure report of {state.name}"):
                self.flush()
        if self.on_error is not OnError.FALLBACK:
            raise error
        log.warning(
            "thunderfx_debug: %s failed under Thunder (%s: %s); THUNDERFX_DEBUG_ON_ERROR=fallback runs it with "
            "inductor from now on", state.name, type(error).__name__, str(error)[:200],
        )
        try:
            return torch_private.inductor_compile(state.gm, args)
        except Exception as inductor_error:
            log.warning("thunderfx_debug: inductor failed on %s too (%s); running it eagerly", state.name, inductor_error)
            state.error += "\n\nThe inductor fallback failed as well:\n" + describe_exception(inductor_error)
            return state.gm
