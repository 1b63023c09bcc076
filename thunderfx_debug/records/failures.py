"""The record of a failure of the run itself: Thunder, nvFuser, inductor or a user's executor raised in a graph the
backend compiled, while compiling it, in a forward or in a backward (the reporting's own failures are the
manifest's `reporting_failures`, never these)."""

from __future__ import annotations

import dataclasses
import enum

from thunderfx_debug.records.codec import JsonRecord, json_field


class FailedIn(str, enum.Enum):
    """Where the run failed: ThunderFX splitting and compiling the graph (the backend call), a forward call of a
    piece, or its backward."""

    COMPILE = "compile"
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclasses.dataclass(frozen=True)
class RunFailure(JsonRecord):
    """The exception the run died of (or, with THUNDERFX_DEBUG_ON_ERROR=fallback, fell back after), as it was raised:
    its own type and message, not a wrapper's (Dynamo wraps a backend's exception and appends its own advice).

    `piece` is what raised ("graph0/thunder_0", or "graph0" where ThunderFX failed to split and compile the graph),
    `region` the fusion region it raised in where a traceback frame of Thunder's trace named one
    ("nvFusion3_forward"), `failed_in` where, at the piece's `call`-th call (0 for a compile failure). `type` is the
    exception's class (`module.Name` beyond the builtins), `message` its own message, `raised_at` the innermost frame
    ("thunder/executors/torch_autograd.py:75 forward") and `raised_code` its line of code. `sources` are the lines of
    the model's code the piece came from (most ops first). `inputs_call` is the call whose inputs the failing
    piece's scripts hold (the failing call, or the first where a backward failed later: the forward's inputs are
    not kept on every call). `not_run` names the pieces of the graph the failure kept from running. `script` is the
    script (in the rank directory) that reproduces the failure on its own, where one was written."""

    piece: str
    failed_in: FailedIn
    type: str
    message: str = ""
    call: int = 0
    region: str | None = json_field(None, omit_default=True)
    raised_at: str = ""
    raised_code: str = ""
    sources: tuple[str, ...] = json_field((), omit_default=True)
    inputs_call: int = 0
    not_run: tuple[str, ...] = json_field((), omit_default=True)
    script: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "failed_in", FailedIn(self.failed_in))

    @property
    def exception(self) -> str:
        """"AssertionError", or "ValueError: size7_tanh refuses ..." (the message's first line)."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first}" if first else self.type

    @property
    def when(self) -> str:
        """"in the backward of call 3", "at its first forward call", "while ThunderFX compiled it"."""
        if self.failed_in is FailedIn.COMPILE:
            return "while ThunderFX split and compiled it"
        call = "its first call" if self.call == 1 else f"its call {self.call}"
        return f"in the backward of {call}" if self.failed_in is FailedIn.BACKWARD else f"in the forward of {call}"
