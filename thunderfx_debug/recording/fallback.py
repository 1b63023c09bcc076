"""What happens when Thunder fails on a graph, at compile, at a call or in a backward (THUNDERFX_DEBUG_ON_ERROR)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from thunderfx_debug.records import FailedIn
from thunderfx_debug.recording.capture import InputCapture
from thunderfx_debug.recording.recorder import GraphState, PieceFailure, Recorder
from thunderfx_debug.settings.config import OnError
from thunderfx_debug.settings.safety import describe_exception
from thunderfx_debug.thunder import torch_private
from thunderfx_debug.thunder.failures import own_exception, own_message

log = logging.getLogger("thunderfx_debug")


class GraphFailureHandler:
    """Records the failure (with the inputs of the failing call, for the scripts of the failing piece), flushes the
    dump so that the failure report exists before anything else happens, then raises the error again
    (`OnError.RAISE`) or returns what runs the graph from now on: inductor, or eager where inductor fails too
    (`OnError.FALLBACK`). Everything but raising is reporting: a failure of it is logged and the run's own exception
    goes on as it would have.

    `flush` writes the dump (None: no dump directory)."""

    def __init__(self, recorder: Recorder, on_error: OnError, capture: InputCapture | None,
                 flush: Callable[[], object] | None):
        self.recorder, self.on_error, self.capture, self.flush = recorder, on_error, capture, flush

    def __call__(self, state: GraphState, error: BaseException, args) -> Callable:
        with self.recorder.failures.guard(f"recording the failure of {state.name}"):
            self._record(state, error, args)
        state.fallback = self.on_error is OnError.FALLBACK  # before the flush, so that the dump says so
        self.write(state)
        if self.on_error is not OnError.FALLBACK:
            raise error
        return self.fallback(state, args, error)

    def _record(self, state: GraphState, error: BaseException, args) -> None:
        if state.split_gm is None:  # failed to compile: the inputs Dynamo handed the backend are the real ones
            if state.captured is None and self.capture is not None:
                self.capture.inputs(state, args)
            self.recorder.graph_failed(state, error)
            return
        captured = None
        if state.calls > 1 and self.capture is not None and state.failure is None:  # a later call: its inputs
            captured = self.capture.call(state.name, args)
        self.recorder.graph_failed(state, error, PieceFailure(FailedIn.FORWARD, state.calls, captured), captured)

    def write(self, state: GraphState) -> None:
        """Writes the dump with the failure of `state`'s graph in it (without a dump directory, nothing)."""
        if self.flush is not None:
            with self.recorder.failures.guard(f"writing the failure report of {state.name}"):
                self.flush()

    def backward_failed(self, state: GraphState, error: BaseException) -> bool:
        """Records that a backward of the graph raised (from inside autograd's engine, which may run it in a thread
        of its own: the dump is written at the graph's next call, `write`, or by the flush at exit); True where the
        graph falls back from its next call."""
        with self.recorder.failures.guard(f"recording the failure of {state.name}'s backward"):
            self.recorder.graph_failed(state, error)
        return self.on_error is OnError.FALLBACK

    def fallback(self, state: GraphState, args, error: BaseException | None = None) -> Callable:
        """What runs the graph from now on: inductor, or eager where inductor fails too."""
        state.fallback = True
        error = own_exception(error) if error is not None else None
        log.warning(
            "thunderfx_debug: %s failed under Thunder (%s); THUNDERFX_DEBUG_ON_ERROR=fallback runs it with inductor "
            "from now on", state.name,
            f"{type(error).__name__}: {own_message(error)[:200]}" if error is not None else "in a backward",
        )
        try:
            return torch_private.inductor_compile(state.gm, args)
        except Exception as inductor_error:
            log.warning("thunderfx_debug: inductor failed on %s too (%s); running it eagerly", state.name, inductor_error)
            state.error = (state.error or "") + "\n\nThe inductor fallback failed as well:\n" + describe_exception(
                inductor_error)
            return state.gm
