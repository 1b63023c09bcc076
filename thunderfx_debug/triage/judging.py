"""Thunder against inductor, one piece at a time: how the flush-time triage (`triage.at_flush`, in a child process,
`triage.child`) calls each side, times them and decides.

What is timed:
- a split: Thunder's compile of the split's FX module, called with grad enabled and its backward run by
  `torch.autograd.grad` with gradients laid out as the run's backward passed them (`TrainingCall`), against
  `torch._inductor.compile` of the same FX module (autograd included, its backward compiled at its first call);
- a fusion region: the callable Thunder's final trace calls (nvFuser's, or the torch.compile executor's), against
  torch.compile(fullgraph=True) of the region's ops as torch calls, both under no_grad.
Both sides run where the recorded call ran: its grad mode and autocast (`RunsAs`). Around Thunder's call after
inductor's first, its cache misses, nvFuser's definitions and Dynamo's recompiles must not grow (`first_calls`):
what is timed is the code Thunder compiled for these inputs, or nothing.

How: rounds of `CALLS` back-to-back calls of each side, the order alternating every round, so that drift (clock boost,
other processes, a cache that warms) hits both sides alike. A round's time is the median of its calls on the host
clock (a preempted call moves one call, not the round), or on CUDA the events around all its calls queued behind a
spin kernel, so that the device's time for the kernels is measured, not the host's launches. The ratio
Thunder/inductor and its interval come from Yuen's trimmed t on the rounds' log times (`stats.yuen`), looked at
after each of `LOOKS` rounds: a piece whose interval already lies beyond THUNDERFX_DEBUG_DEVIATION (it deviates) or
within it (it does not) stops there. Each look's interval is at 1 - 5%/len(LOOKS), so that the chance that the
interval a piece stops at misses its ratio stays within 5% over all looks (Bonferroni).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import stats
from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.settings.config import TriageLevel
from thunderfx_debug.records import DEVIATION, ClockKind, Memory, Triage, deviation_outcome
from thunderfx_debug.scripts import device_timer
from thunderfx_debug.recording.memory import parameter_storages, saved_storages
from thunderfx_debug.recording.check import AutocastState
from thunderfx_debug.settings.safety import describe_exception
from thunderfx_debug.thunder import counterparts


#: The rounds after which a piece's interval is looked at (the last is the most a piece gets), and calls per side in
#: each round.
LOOKS = (7, 14, 21)
CALLS = 9
#: The chance that the interval a piece stops at holds its ratio, over all looks.
CONFIDENCE = 0.95

#: What of an error a record keeps at most: its first and last characters (see `safety.describe_exception`).
ERROR_HEAD, ERROR_TAIL = 50_000, 200_000



# ---- timing ---------------------------------------------------------------------------------------------------------
RoundTimer = Callable[[Callable[[], Any], int], float]


def host_round(call: Callable[[], Any], calls: int) -> float:
    """Median host ms of `calls` back-to-back calls."""
    per_call = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        call()
        per_call.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(per_call)


def cuda_round(call: Callable[[], Any], calls: int) -> float:
    """Device ms per call of `calls` back-to-back calls (`device_timer.held_device_ms`), behind a hold sized from one
    call timed alone; waits for the device each round (at flush, not training)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()  # a host estimate of one call, to size the hold
    torch.cuda.synchronize()
    return device_timer.held_device_ms(call, calls, host_ms=(time.perf_counter() - started) * 1e3)


def interleaved(thunder: Callable[[], Any], inductor: Callable[[], Any], timer: RoundTimer = host_round,
                rounds: int = LOOKS[-1], calls: int = CALLS, first_round: int = 0) -> tuple[list[float], list[float]]:
    """Per-round ms per call of each side, the side that goes first alternating every round (Thunder first in even
    rounds, counting from `first_round`).

    Example (a fake round timer that says which side ran):
        >>> interleaved(lambda: 2.0, lambda: 1.0, timer=lambda call, calls: call(), rounds=2)
        ([2.0, 2.0], [1.0, 1.0])
    """
    thunder_ms: list[float] = []
    inductor_ms: list[float] = []
    for r in range(first_round, first_round + rounds):
        sides = ((thunder, thunder_ms), (inductor, inductor_ms))
        for call, out in sides if r % 2 == 0 else sides[::-1]:
            out.append(timer(call, calls))
    return thunder_ms, inductor_ms


def verdict(thunder_ms: Sequence[float], inductor_ms: Sequence[float], deviation: float,
            confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Ratio Thunder/inductor, its interval at `confidence`, and whether it deviates beyond `deviation`, from
    per-round times.

    Example:
        >>> v = verdict([3.0, 3.1, 2.9, 3.0, 3.05], [1.0, 1.02, 0.98, 1.0, 1.01], 1.2)
        >>> round(v["ratio"], 1), v["deviates"], round(v["thunder_ms"], 2)
        (3.0, True, 3.0)
    """
    logs_thunder = [math.log(x) for x in thunder_ms if x > 0]
    logs_inductor = [math.log(x) for x in inductor_ms if x > 0]
    difference, error, df = stats.yuen(logs_inductor, logs_thunder)  # log(thunder) - log(inductor)
    half = stats.t_isf((1 - confidence) / 2, max(df, 1.0)) * error
    low, high = math.exp(difference - half), math.exp(difference + half)
    return {
        "thunder_ms": statistics.median(thunder_ms), "inductor_ms": statistics.median(inductor_ms),
        "ratio": math.exp(difference), "ratio_low": low, "ratio_high": high,
        "deviates": deviation_outcome(low, high, deviation) == "deviates", "rounds": len(thunder_ms),
    }


def decided(figures: Mapping[str, Any], deviation: float) -> bool:
    """Whether more rounds could not change the verdict: the interval lies beyond the deviation, or within it.

    Example:
        >>> decided({"ratio_low": 1.05, "ratio_high": 1.15, "deviates": False}, 1.2), decided(
        ...     {"ratio_low": 1.1, "ratio_high": 1.3, "deviates": False}, 1.2)
        (True, False)
    """
    return figures["deviates"] or deviation_outcome(figures["ratio_low"], figures["ratio_high"], deviation) == "within"


def timed(thunder: Callable[[], Any], inductor: Callable[[], Any], timer: RoundTimer, deviation: float,
          looks: Sequence[int] = LOOKS, calls: int = CALLS) -> dict[str, Any]:
    """The verdict of interleaved rounds, stopping at the first look where it is decided (see the module docstring).

    Example (two sides whose rounds are 1.0 and 1.02 ms: within 1.2x from the first look on):
        >>> times = iter([1.0, 1.02, 1.02, 1.0] * 20)
        >>> timed(lambda: None, lambda: None, lambda call, calls: next(times), 1.2)["rounds"]
        7
    """
    confidence = 1 - (1 - CONFIDENCE) / len(looks)
    thunder_ms: list[float] = []
    inductor_ms: list[float] = []
    figures: dict[str, Any] = {}
    for look in looks:
        more_thunder, more_inductor = interleaved(thunder, inductor, timer, look - len(thunder_ms), calls,
                                                  first_round=len(thunder_ms))
        thunder_ms += more_thunder
        inductor_ms += more_inductor
        figures = verdict(thunder_ms, inductor_ms, deviation, confidence)
        if decided(figures, deviation):
            break
    return figures


def clock_of(values: Sequence[Any]) -> tuple[ClockKind, RoundTimer]:
    on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)
    return (ClockKind.CUDA, cuda_round) if on_cuda else (ClockKind.HOST, host_round)


# ---- the pieces -----------------------------------------------------------------------------------------------------
class TrainingCall:
    """A training-like call of `fn(*args)`: its forward with grad, and the gradients of the inputs that require one
    (by `torch.autograd.grad`: nothing accumulates into `.grad`), each output receiving a gradient of ones laid out as
    the one it received in the run's backward (`grad_outputs`, per output leaf; an output that received none gets
    none), else contiguous ones. The gradients are made at the first call and reused. `restore`: (input, its value
    as the run passed it) of the inputs the piece writes into, copied back before each call, so that every call
    starts from the run's values (T5 adds into its relative-position buckets in place: called again on the same
    tensor, it would add again and index past its table); both sides of a comparison pay the same copies."""

    def __init__(self, fn: Callable, args: Sequence[Any], grad_outputs: Sequence[Any] | None = None,
                 restore: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()):
        self._fn, self._args, self._layouts, self._restore = fn, args, grad_outputs, tuple(restore)
        self._wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        self._gradients: dict[int, torch.Tensor] = {}

    def __call__(self) -> None:
        self.backward(*self.forward())

    def forward(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The call's forward: the outputs that get a gradient, and their gradients."""
        if self._restore:
            with torch.no_grad():
                for written, as_passed in self._restore:
                    written.copy_(as_passed)
        outputs, gradients = [], []
        for i, output in enumerate(tree_leaves(self._fn(*self._args))):
            if not isinstance(output, torch.Tensor) or output.grad_fn is None:
                continue
            gradient = self._gradient(i, output)
            if gradient is not None:
                outputs.append(output)
                gradients.append(gradient)
        return outputs, gradients

    def backward(self, outputs: list[torch.Tensor], gradients: list[torch.Tensor]) -> None:
        if outputs and self._wanted:
            torch.autograd.grad(outputs, self._wanted, gradients, allow_unused=True)

    @property
    def args(self) -> Sequence[Any]:
        return self._args

    def _gradient(self, i: int, output: torch.Tensor) -> torch.Tensor | None:
        if i in self._gradients:
            return self._gradients[i]
        layout = self._layouts[i] if self._layouts is not None and i < len(self._layouts) else False
        if layout is None:  # the run's backward gave this output no gradient
            gradient = None
        elif layout and tuple(layout.shape) == tuple(output.shape) and layout.dtype == str(output.dtype):
            gradient = script_template.tensor(layout.shape, output.dtype, stride=layout.stride,
                                              offset=layout.storage_offset, storage=layout.storage_size,
                                              device=output.device, value=1.0)
        else:
            gradient = torch.ones_like(output)
        self._gradients[i] = gradient
        return gradient


def memory_of(call: TrainingCall) -> Memory:
    """What one call of a split holds (see `records.Memory`): the distinct storages autograd saves in its forward
    (the same count as the run's, `recording.memory`, parameters left out) and, on CUDA, the peaks of its forward and
    of its backward above what was allocated before each, from the allocator's peak counter, which this process may
    reset (it is the triage's own; it waits for the device around each phase). Its gradients are made first, so
    that they are not counted in a peak."""
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in call.args)
    call.backward(*call.forward())  # the gradients made once, kept by `call`
    peaks: dict[str, int] = {}

    def start() -> int:
        if not on_cuda:
            return 0
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def end(phase: str, before: int) -> None:
        if on_cuda:
            torch.cuda.synchronize()
            peaks[phase] = torch.cuda.max_memory_allocated() - before

    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    before = start()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs, gradients = call.forward()
    end("forward", before)
    nbytes = sum(saved_storages(saved, parameter_storages(call.args, ())).values())
    saved.clear()
    before = start()
    call.backward(outputs, gradients)
    end("backward", before)
    return Memory(saved_bytes=nbytes, peak_forward_bytes=peaks.get("forward"),
                  peak_backward_bytes=peaks.get("backward"), calls=1, peak_calls=1 if peaks else 0)


def no_grad_call(fn: Callable, args: Sequence[Any]) -> Callable[[], Any]:
    def call():
        with torch.no_grad():
            return fn(*args)

    return call


class RunsAs:
    """Grad mode and autocast entered around a piece's triage: those of its recorded call (a split; Thunder's cache
    checks both, and inductor traces under them), or those of a trace's inside (a region: no grad, no autocast, its
    ops lowered already)."""

    def __init__(self, grad: bool, autocast: tuple[tuple[str, bool, torch.dtype], ...]):
        self._grad, self._autocast = grad, AutocastState(autocast)

    @classmethod
    def inside_a_trace(cls) -> RunsAs:
        devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        return cls(False, tuple((d, False, torch.get_autocast_dtype(d)) for d in devices))

    def __enter__(self) -> None:
        self._grad_before = torch.is_grad_enabled()
        torch.set_grad_enabled(self._grad)
        self._restored = self._autocast.restored()
        self._restored.__enter__()

    def __exit__(self, *exc) -> None:
        self._restored.__exit__(*exc)
        torch.set_grad_enabled(self._grad_before)


#: Seconds a piece's triage may take in its child process (compiles included) before the child is ended.
PIECE_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class TriageSettings:
    """THUNDERFX_DEBUG_TRIAGE's level and DEVIATION, the rounds, and how the pieces run: `timeout_s` per piece
    (THUNDERFX_DEBUG_TRIAGE_TIMEOUT); `processes` "fork" (children forked from the training process, which has every
    executor it registered; only where it has not initialised CUDA), "workers" (fresh interpreters), or "auto"
    (fork where it may); `workers` how many fresh interpreters at once (0: a quarter of the cores, at most 4; they
    compile at once and take turns on the device); `device_margin` THUNDERFX_DEBUG_DEVICE_MARGIN, the percent of the
    device that stays free beyond the training's high-water mark before a child compiles ahead of the flush."""

    level: TriageLevel = TriageLevel.OFF
    deviation: float = DEVIATION
    looks: tuple[int, ...] = LOOKS
    calls: int = CALLS
    timeout_s: float = PIECE_TIMEOUT_S
    processes: str = "auto"
    workers: int = 0
    device_margin: float = 25.0


class NotJudged(Exception):
    """A piece that cannot be judged, and why (the message is the record's `error`, whole)."""


def because(what: str, error: BaseException) -> str:
    """`what` happened, with the exception's message on the first line and its whole traceback after it."""
    message = str(error).strip().splitlines()
    # Whole: a compiler's error can sit in the middle of a long log of its warnings (capped only far beyond that).
    whole = describe_exception(error, head=ERROR_HEAD, tail=ERROR_TAIL)
    return f"{what}: {type(error).__name__}: {message[0] if message else ''}\n{whole}"


def first_calls(thunder: Callable[[], Any], inductor: Callable[[], Any], compiled: Callable | None,
                regions: Sequence[Any], what: str, step: Callable[[str], None] = lambda what: None) -> float:
    """The first call of each side after Thunder compiled: inductor compiles there (a split's backward at its first
    backward); Thunder must not. `step` is told which call comes next (a process that dies in it is said to have
    died there). Returns the seconds inductor's first call took."""
    started = time.perf_counter()
    step(f"inductor's first call of {what}")
    try:
        inductor()
    except Exception as e:
        raise NotJudged(because(f"inductor failed on {what}", e)) from e
    inductor_s = time.perf_counter() - started
    before = counterparts.compile_marks(compiled, regions)
    step(f"Thunder's call of {what} after inductor's first")
    try:
        thunder()
    except Exception as e:
        raise NotJudged(because(f"Thunder failed on {what} with the triage's inputs", e)) from e
    after = counterparts.compile_marks(compiled, regions)
    if after != before:
        what_grew = [name for name, b, a in zip(("Thunder's cache misses", "nvFuser definitions",
                                                  "Dynamo recompiles"), before, after) if a != b]
        raise NotJudged(f"Thunder compiled {what} again for the triage's inputs ({', '.join(what_grew)} grew): they "
                        "differ from the run's in something its checks see, and timing it would time another "
                        "compile of it (a bug of thunderfx_debug's inputs)")
    return inductor_s


def judge(thunder: Callable[[], Any], inductor: Callable[[], Any], values: Sequence[Any], settings: TriageSettings,
           inputs: str, compile_s: float) -> Triage:
    """Both sides timed in interleaved rounds (`timed`), as a triage record."""
    clock, timer = clock_of(values)
    started = time.perf_counter()
    figures = timed(thunder, inductor, timer, settings.deviation, settings.looks, settings.calls)
    return Triage(clock=clock, deviation=settings.deviation, inputs=inputs,
                  compile_s=compile_s, timing_s=time.perf_counter() - started, **figures)


