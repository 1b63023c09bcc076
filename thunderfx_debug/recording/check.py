"""The correctness sentinel (THUNDERFX_DEBUG_CHECK): which calls are checked, what a check leaves behind, and how it
keeps the training untouched. The checks themselves: `split_check` (a Thunder split against its FX graph run by
PyTorch, forward and gradients) and `region_check` (each fusion region against its torch reference, and whether
what it returned still holds at the end of the split).

A checked call runs as usual first; the references run afterwards on the same real inputs, detached, under
`no_grad` (or on leaf copies for the gradients), in the checks' isolation (`isolation`: on CUDA their own memory
pool and stream; the CPU and CUDA random states saved and restored around them, `kept_random_state`), so that the
training's random numbers, memory layout, losses and parameters do not change. What a check finds goes into a
`CheckTally` per piece (read into `records.Check` at report time), including the calls on which the check itself
failed (`guarded`); the values it made are dropped when it is done, except the host copies of the first mismatching
call (`Evidence`, within THUNDERFX_DEBUG_INPUTS_MAX_MB) for the mismatch script written at flush.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import MAX_CHECK_REASONS, Check
from thunderfx_debug.recording import device_room
from thunderfx_debug.recording.capture import Captured, InputCapture
from thunderfx_debug.recording.compare import Judged
from thunderfx_debug.recording.timing import NEVER
from thunderfx_debug.recording.turns import OrdinaryPeriods, Turn
from thunderfx_debug.settings.safety import ReportingFailures

@dataclasses.dataclass(frozen=True)
class CheckSchedule:
    """Checked calls: the first call of each graph and every `every`-th after (1, 1 + every, 1 + 2 * every, ...).

    Example:
        >>> [call for call in range(1, 120) if CheckSchedule(50).is_checked(call)]
        [1, 51, 101]
    """

    every: int

    def is_checked(self, call: int) -> bool:
        return call >= 1 and (call - 1) % self.every == 0

    def next_checked(self, after: int) -> int:
        """The first checked call after call `after`."""
        return 1 if after < 1 else 1 + ((after - 1) // self.every + 1) * self.every


class CheckedCalls:
    """What a graph's checked calls cost the training beyond the blocks of the checks' own work, charged to the
    turns (THUNDERFX_DEBUG_CHECK_SHARE below 100) of the graph's splits that took the call.

    Why: a split's turn is charged the wall time of its check's blocks (`Turn.spending`), but a checked step costs
    more than they hold: on the H200's realistic Mixtral (43 splits) the checks took about twice their share. What
    lies outside them (the training's wait for a device drained by the check's own waits, allocations, the
    instrumented regions' bookkeeping) is not known piece by piece; the checked call's period is. At the graph's
    next call, its period over an ordinary call's (`OrdinaryPeriods`), where larger than what the blocks hold, is
    charged to the turns that took it in proportion to their blocks. The first call is not (its period holds the
    compile). Where one step calls several graphs, a graph's period also holds the others' checks: the charge errs
    high, so the checks take at most about their share.

    Example (two splits' turns took call 51, their blocks 10 and 30 ms; the call lasted 100 ms where an ordinary
    one lasts 20: 80 ms in all, 40 of them outside the blocks, charged 10 and 30):
        >>> from thunderfx_debug.recording.turns import OrdinaryPeriods, Turns
        >>> turns = Turns(1.0, counter=lambda: 0)
        >>> a, b = turns.join(), turns.join()
        >>> periods = OrdinaryPeriods()
        >>> checked = CheckedCalls(CheckSchedule(50), [a, b], periods)
        >>> periods.add(20.0)
        >>> a.taken = b.taken = 51
        >>> a.charge(10e6); b.charge(30e6)
        >>> checked.charge(51, 100.0)
        >>> a.spent_ns / 1e6, b.spent_ns / 1e6
        (20.0, 60.0)
    """

    def __init__(self, schedule: CheckSchedule, turns: list[Turn], periods: OrdinaryPeriods):
        self.schedule, self.turns, self.periods = schedule, turns, periods

    def is_checked(self, call: int) -> bool:
        return self.schedule.is_checked(call)

    def next_checked(self, after: int) -> int:
        return self.schedule.next_checked(after)

    def charge(self, call: int, period_ms: float) -> None:
        """Checked call `call` lasted `period_ms`. A call no split took is an ordinary one."""
        taken = [turn for turn in self.turns if turn.taken == call]
        if not taken:
            self.periods.add(period_ms)
            return
        excess_ms = self.periods.excess_ms(period_ms)
        if call == 1 or excess_ms is None:
            return
        blocks_ns = sum(turn.spent_ns for turn in taken)
        beyond_ns = excess_ms * 1e6 - blocks_ns
        if beyond_ns <= 0:
            return
        for turn in taken:
            turn.charge(beyond_ns * (turn.spent_ns / blocks_ns if blocks_ns > 0 else 1 / len(taken)))


class TimingBesideChecks:
    """The timing samples of a run that also checks: a sample that falls on a checked call is taken on the next
    call instead, because a checked call's references run inside the graph's (and the trace's) timing marks.

    Example (timing every 5 calls after a warm-up of 0, checks every 5: each sample moves one call later):
        >>> from thunderfx_debug.recording.timing import Sampling
        >>> both = TimingBesideChecks(Sampling(every=5, warmup=0), CheckSchedule(5))
        >>> [call for call in range(1, 13) if both.is_sampled(call)]
        [2, 7, 12]
    """

    def __init__(self, sampling, schedule: CheckSchedule):
        self.sampling, self.schedule = sampling, schedule

    @property
    def enabled(self) -> bool:
        return self.sampling.enabled

    def is_sampled(self, call: int) -> bool:
        if self.schedule.is_checked(call):
            return False
        return self.sampling.is_sampled(call) or (
            call > 1 and self.schedule.is_checked(call - 1) and self.sampling.is_sampled(call - 1))

    def index(self, call: int) -> int:
        """How many of the timing's own samples there have been up to sampled call `call` (a sample moved to the
        call after a checked one counts as the one it was moved from).

        Example:
            >>> from thunderfx_debug.recording.timing import Sampling
            >>> both = TimingBesideChecks(Sampling(every=5, warmup=0), CheckSchedule(5))
            >>> [both.index(call) for call in (2, 7, 12)]
            [1, 2, 3]
        """
        return self.sampling.index(call if self.sampling.is_sampled(call) else call - 1)

    #: How many of the timing's own samples `next_sampled` looks through before it says never (each one checked
    #: and so is the call after it: checks on every call).
    SEARCH = 64

    def next_sampled(self, after: int) -> int:
        """The first sampled call after call `after` (`timing.NEVER` when there is none): the timing's own sample,
        or the call after it where that one is checked."""
        sampling, schedule = self.sampling, self.schedule
        own = after if sampling.is_sampled(after) else sampling.next_sampled(after)
        for _ in range(self.SEARCH):
            if own >= NEVER:
                break
            if schedule.is_checked(own):
                if not schedule.is_checked(own + 1):
                    return own + 1
            elif own > after:
                return own
            own = sampling.next_sampled(own)
        return NEVER


@dataclasses.dataclass
class Evidence:
    """The first mismatching call of a piece, for its mismatch script: the call and phase, host copies (`captured`,
    None where over the cap) of the inputs the piece received and, for a forward mismatch, what it returned; for a
    gradient mismatch, `gradients` holds the incoming gradients (as its `inputs`) and the gradients the piece
    passed to its inputs that require one (as its `outputs`, None where not compared). `values` are the positions
    the sentinel compared: of the outputs, or for gradients among the inputs that require one. `findings` are the
    verdicts' lines. A mismatch of values that changed after they were returned keeps no values (`captured` None):
    by the end of the trace the region's inputs are gone."""

    call: int
    phase: str
    captured: Captured | None
    findings: list[str]
    values: tuple[int, ...] = ()
    gradients: Captured | None = None


class CheckTally:
    """What the checks of one piece found so far; `record()` reads it as a `records.Check` (None before any check).

    Hooks of a backward check may run on autograd's device thread while the training thread runs another piece's
    check; each change here is a few dict and set operations, which the GIL keeps whole."""

    def __init__(self):
        self._calls: set[int] = set()
        self._mismatching: set[int] = set()
        self._failing: set[int] = set()
        self.compared = 0
        self.worst: tuple[Judged, int] | None = None
        self.skipped: dict[str, None] = {}
        self.failed: dict[str, None] = {}
        self.mismatched_values: dict[str, None] = {}
        self.evidence: Evidence | None = None
        self.verified_gradients = 0
        self.writes_unowned_memory = False
        self.overwritten = False
        self.turn: Turn | None = None  # a split's tally: its turns, whose passed-over calls its record counts

    def checked(self, call: int) -> None:
        self._calls.add(call)

    def add(self, call: int, judged: Iterable[Judged]) -> list[Judged]:
        """Adds the verdicts of one comparison of call `call`; returns those that are mismatches."""
        self._calls.add(call)
        mismatches = []
        for j in judged:
            self.compared += 1
            if self.worst is None or j.ratio > self.worst[0].ratio:
                self.worst = (j, call)
            if j.mismatch:
                mismatches.append(j)
                if len(self.mismatched_values) < MAX_CHECK_REASONS:
                    self.mismatched_values.setdefault(j.label, None)
        if mismatches:
            self._mismatching.add(call)
        return mismatches

    def skip(self, call: int, reason: str) -> None:
        self._calls.add(call)
        if reason not in self.skipped and len(self.skipped) < MAX_CHECK_REASONS:
            self.skipped[reason] = None

    def fail(self, call: int, what: str, error: BaseException) -> None:
        """The check itself failed on `call` while doing `what`: the piece is not checked clean on that call."""
        self._calls.add(call)
        self._failing.add(call)
        reason = f"{what} raised {type(error).__name__}: {str(error).strip()[:200]}"
        if reason not in self.failed and len(self.failed) < MAX_CHECK_REASONS:
            self.failed[reason] = None

    @property
    def calls(self) -> int:
        return len(self._calls)

    def record(self) -> Check | None:
        if not self._calls:
            return None
        worst, call = self.worst if self.worst is not None else (None, None)
        return Check(
            calls=len(self._calls),
            mismatches=len(self._mismatching),
            compared=self.compared,
            first_mismatch_call=min(self._mismatching) if self._mismatching else None,
            worst_output=worst.label if worst else None,
            worst_call=call,
            worst_abs_error=worst.abs_error if worst else None,
            worst_rel_error=worst.rel_error if worst else None,
            worst_ratio=worst.ratio if worst else None,
            rtol=worst.rtol if worst else None,
            atol=worst.atol if worst else None,
            allowed=worst.allowed if worst else None,
            reference=worst.reference if worst else None,
            skipped=tuple(self.skipped),
            mismatched_values=tuple(self.mismatched_values),
            failures=len(self._failing),
            failed=tuple(self.failed),
            verified_gradients=self.verified_gradients,
            writes_unowned_memory=self.writes_unowned_memory,
            overwritten=self.overwritten,
            passed_over=self.turn.passed_over if self.turn is not None else 0,
        )


@contextlib.contextmanager
def guarded(failures: ReportingFailures, tally: CheckTally | None, call: int, what: str, label: str) -> Iterator[None]:
    """Runs a block of a check: an exception in it is noted on `tally` (the check of the piece failed on `call`, so
    the piece is not counted clean) and handed to `failures` as "`what` of `label`" (logged once, raised in strict
    mode), as `ReportingFailures.guard` does. A block that ran out of device memory is no failure of the check: the
    call is not checked, and says why (`OUT_OF_MEMORY`), logged once."""
    try:
        yield
    except Exception as error:
        if device_room.is_out_of_memory(error):
            if tally is not None:
                tally.skip(call, f"{OUT_OF_MEMORY} while {what} ({device_room.out_of_memory_line(error)}): the check "
                                 "takes device memory of its own only while it runs, and gives it back; the training "
                                 "was not touched")
            failures.note_once(OUT_OF_MEMORY, "thunderfx_debug: the correctness check of %s (call %d) could not get "
                               "the device memory it needed while %s: not checked (%s); the training goes on as it "
                               "was, and later checks try again", label, call, what,
                               device_room.out_of_memory_line(error))
            return
        if tally is not None:
            tally.fail(call, what, error)
        failures.record(f"{what} of {label}", error)
        if failures.strict:
            raise


#: How the reason of a call not checked for want of device memory begins.
OUT_OF_MEMORY = "not checked: out of device memory"


def describe_findings(mismatches: Sequence[Judged]) -> list[str]:
    """Lines for a mismatch script's docstring: each value beyond its tolerance, with its numbers."""
    lines = []
    for j in mismatches:
        ratio = "inf" if math.isinf(j.ratio) else f"{j.ratio:.3g}"
        lines.append(f"{j.label}: error {j.abs_error:.3g} (relative {j.rel_error:.3g}), {ratio} of the "
                     f"{j.allowed:.3g} allowed against {j.reference}")
    return lines


class EvidenceKeeper:
    """Takes the host copies of a piece's first mismatching call (`Evidence`), within `max_mb` (the run's
    THUNDERFX_DEBUG_INPUTS_MAX_MB) for inputs and outputs together."""

    class _Holder:
        """What `InputCapture` captures into (it fills `captured`)."""

        def __init__(self, name: str):
            self.name, self.captured = name, None

    def __init__(self, max_mb: float, failures: ReportingFailures):
        self._capture = InputCapture(real=True, max_mb=max_mb, failures=failures, statistics=False)

    def keep(self, tally: CheckTally, name: str, call: int, phase: str, inputs: Sequence[Any] | None, outputs: Any,
             mismatches: Sequence[Judged], values: Sequence[int] = (),
             grad_outputs: Sequence[Any] | None = None) -> None:
        """Keeps the evidence of `tally`'s first mismatch (nothing once it has one, or without `mismatches`).
        With `grad_outputs` (a gradient mismatch), `outputs` are the gradients the piece passed on; without
        `inputs`, only the findings are kept."""
        if tally.evidence is not None or not mismatches:
            return
        captured = None
        if inputs is not None:
            holder = self._Holder(name)
            self._capture.inputs(holder, list(inputs))
            if grad_outputs is None:
                self._capture.outputs(holder, outputs)
            captured = holder.captured
        evidence = Evidence(call, phase, captured, describe_findings(mismatches), tuple(values))
        if grad_outputs is not None:
            gradients = self._Holder(name)
            self._capture.inputs(gradients, list(grad_outputs))
            self._capture.outputs(gradients, list(outputs))
            evidence.gradients = gradients.captured
        tally.evidence = evidence


def tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    return [v for v in tree_leaves(list(values)) if isinstance(v, torch.Tensor)]


@contextlib.contextmanager
def kept_random_state(values: Iterable[Any]) -> Iterator[None]:
    """Saves the CPU random state and that of the CUDA devices `values` live on (and the current one), and restores
    them afterwards (`torch.random.fork_rng`): a reference run draws no number from the training's streams."""
    devices = {t.device.index for t in tensors(values) if t.is_cuda and t.device.index is not None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices.add(torch.cuda.current_device())
    with torch.random.fork_rng(devices=sorted(devices)):
        yield


def version(value: Any) -> int | None:
    """A tensor's version counter (bumped by every in-place write through PyTorch), None for other values."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value._version
    except RuntimeError:  # inference tensors have none
        return None


@dataclasses.dataclass(frozen=True)
class AutocastState:
    """The autocast settings in force on the devices of a piece's inputs, captured at its forward, so that the
    reference of its backward (which runs where autocast is usually off) computes as the forward did."""

    settings: tuple[tuple[str, bool, torch.dtype], ...]

    @classmethod
    def capture(cls, values: Iterable[Any]) -> AutocastState:
        device_types = sorted({t.device.type for t in tensors(values)} & {"cpu", "cuda"})
        return cls(tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in device_types))

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for device_type, enabled, dtype in self.settings:
                stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
            yield
