"""Flush-time triage in the training process (THUNDERFX_DEBUG_TRIAGE): each Thunder split, and at `fusion` each of its
fusion regions, timed against the same piece compiled by inductor, on the inputs of a recorded call.

What is timed:
- a split: the ThunderModule the run compiled, called with grad enabled and its backward run by `torch.autograd.grad`
  (no `.grad` of the run's parameters is touched) with gradients laid out as the run's backward passed them, against
  `torch._inductor.compile` of the split's original FX module (autograd included, its backward compiled at its first
  call);
- a fusion region: the callable Thunder's final trace calls (nvFuser's, or the torch.compile executor's), against
  torch.compile(fullgraph=True) of the region's ops as torch calls, both under no_grad.
Both sides run where the recorded call ran: its grad mode and autocast (Thunder's cache checks both), on the inputs of
`piece_inputs` (the run's own tensors where alive, else its captured or rebuilt ones, placed as the run placed them),
with the training's random streams saved and restored around. Before anything is timed, Thunder's own prologue says
whether the split would run its cached code on those inputs (`counterparts.refusal`); around Thunder's first call,
its cache misses, nvFuser's definitions and Dynamo's recompiles say whether it compiled again. Either way the piece
is "not judged", with the reason: what is timed is the code the run ran, or nothing.

How: rounds of `CALLS` back-to-back calls of each side, the order alternating every round, so that drift (clock boost,
other processes, a cache that warms) hits both sides alike. A round's time is the median of its calls on the host
clock (a preempted call moves one call, not the round), or on CUDA the events around all its calls queued behind a
spin kernel, so that the device's time for the kernels is measured, not the host's launches. The ratio
Thunder/inductor and its interval come from Yuen's trimmed t on the rounds' log times (`stats.yuen`), looked at
after each of `LOOKS` rounds: a piece whose interval already lies beyond THUNDERFX_DEBUG_DEVIATION (it deviates) or
within it (it does not) stops there. Each look's interval is at 1 - 5%/len(LOOKS), so that the chance that the
interval a piece stops at misses its ratio stays within 5% over all looks (Bonferroni).

Inductor's counterparts are compiled with its compile workers started first, and dropped after the piece is timed.
Results are kept per piece while its final traces stay the same objects, so a later flush of the same run times
nothing again; a flush that cannot time (SIGTERM's) marks the pieces not timed yet with why, and a later one times them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug import piece_inputs, stats
from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.config import TriageLevel
from thunderfx_debug.records import DEVIATION, ClockKind, SplitKind, Triage
from thunderfx_debug.recording import device_timer
from thunderfx_debug.recording.capture import Captured
from thunderfx_debug.recording.check import AutocastState, kept_random_state
from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot
from thunderfx_debug.safety import ReportingFailures, describe_exception
from thunderfx_debug.thunder import counterparts
from thunderfx_debug.thunder import torch_private
from thunderfx_debug.thunder.compile_events import SPANS

log = logging.getLogger("thunderfx_debug")

#: The rounds after which a piece's interval is looked at (the last is the most a piece gets), and calls per side in
#: each round.
LOOKS = (7, 14, 21)
CALLS = 9
#: The chance that the interval a piece stops at holds its ratio, over all looks.
CONFIDENCE = 0.95

#: What of an error a record keeps at most: its first and last characters (see `safety.describe_exception`).
ERROR_HEAD, ERROR_TAIL = 50_000, 200_000

#: owner key ("graph0/thunder_0", "graph0/thunder_0/nvFusion0_forward") -> its triage
TriageIndex = Mapping[str, Triage]


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
        "deviates": low > deviation or high < 1 / deviation, "rounds": len(thunder_ms),
    }


def decided(figures: Mapping[str, Any], deviation: float) -> bool:
    """Whether more rounds could not change the verdict: the interval lies beyond the deviation, or within it.

    Example:
        >>> decided({"ratio_low": 1.05, "ratio_high": 1.15, "deviates": False}, 1.2), decided(
        ...     {"ratio_low": 1.1, "ratio_high": 1.3, "deviates": False}, 1.2)
        (True, False)
    """
    return figures["deviates"] or (figures["ratio_low"] >= 1 / deviation and figures["ratio_high"] <= deviation)


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


def _clock_of(values: Sequence[Any]) -> tuple[ClockKind, RoundTimer]:
    on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)
    return (ClockKind.CUDA, cuda_round) if on_cuda else (ClockKind.HOST, host_round)


# ---- the pieces -----------------------------------------------------------------------------------------------------
class TrainingCall:
    """A training-like call of `fn(*args)`: its forward with grad, and the gradients of the inputs that require one
    (by `torch.autograd.grad`: nothing accumulates into `.grad`), each output receiving a gradient of ones laid out as
    the one it received in the run's backward (`grad_outputs`, per output leaf; an output that received none gets
    none), else contiguous ones. The gradients are made at the first call and reused."""

    def __init__(self, fn: Callable, args: Sequence[Any], grad_outputs: Sequence[Any] | None = None):
        self._fn, self._args, self._layouts = fn, args, grad_outputs
        self._wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        self._gradients: dict[int, torch.Tensor] = {}

    def __call__(self) -> None:
        outputs, gradients = [], []
        for i, output in enumerate(tree_leaves(self._fn(*self._args))):
            if not isinstance(output, torch.Tensor) or output.grad_fn is None:
                continue
            gradient = self._gradient(i, output)
            if gradient is not None:
                outputs.append(output)
                gradients.append(gradient)
        if outputs and self._wanted:
            torch.autograd.grad(outputs, self._wanted, gradients, allow_unused=True)

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


def _no_grad(fn: Callable, args: Sequence[Any]) -> Callable[[], Any]:
    def call():
        with torch.no_grad():
            return fn(*args)

    return call


class _RunsAs:
    """Grad mode and autocast entered around a piece's triage: those of its recorded call (a split; Thunder's cache
    checks both, and inductor traces under them), or those of a trace's inside (a region: no grad, no autocast, its
    ops lowered already)."""

    def __init__(self, grad: bool, autocast: tuple[tuple[str, bool, torch.dtype], ...]):
        self._grad, self._autocast = grad, AutocastState(autocast)

    @classmethod
    def recorded(cls, captured: Captured | None) -> _RunsAs:
        return cls(True, ()) if captured is None else cls(captured.grad_enabled, captured.autocast)

    @classmethod
    def inside_a_trace(cls) -> _RunsAs:
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


@dataclasses.dataclass(frozen=True)
class TriageSettings:
    level: TriageLevel = TriageLevel.OFF
    deviation: float = DEVIATION
    looks: tuple[int, ...] = LOOKS
    calls: int = CALLS


class NotJudged(Exception):
    """A piece that cannot be judged, and why (the message is the record's `error`, whole)."""


def _because(what: str, error: BaseException) -> str:
    """`what` happened, with the exception's message on the first line and its whole traceback after it."""
    message = str(error).strip().splitlines()
    # Whole: a compiler's error can sit in the middle of a long log of its warnings (capped only far beyond that).
    whole = describe_exception(error, head=ERROR_HEAD, tail=ERROR_TAIL)
    return f"{what}: {type(error).__name__}: {message[0] if message else ''}\n{whole}"


def _first_calls(thunder: Callable[[], Any], inductor: Callable[[], Any], compiled: Callable | None,
                 regions: Sequence[Any], what: str) -> float:
    """The first call of each side: inductor compiles there (a split's backward at its first backward); Thunder must
    not. Returns the seconds inductor's first call took."""
    started = time.perf_counter()
    try:
        inductor()
    except Exception as e:
        raise NotJudged(_because(f"inductor failed on {what}", e)) from e
    inductor_s = time.perf_counter() - started
    before = counterparts.compile_marks(compiled, regions)
    try:
        thunder()
    except Exception as e:
        raise NotJudged(_because(f"Thunder failed on {what} with the triage's inputs", e)) from e
    after = counterparts.compile_marks(compiled, regions)
    if after != before:
        what_grew = [name for name, b, a in zip(("Thunder's cache misses", "nvFuser definitions",
                                                  "Dynamo recompiles"), before, after) if a != b]
        raise NotJudged(f"Thunder compiled {what} again for the triage's inputs ({', '.join(what_grew)} grew): they "
                        "differ from the run's in something its checks see, and timing it would time another "
                        "compile of it (a bug of thunderfx_debug's inputs)")
    return inductor_s


def _judge(thunder: Callable[[], Any], inductor: Callable[[], Any], values: Sequence[Any], settings: TriageSettings,
           calls_per_step: float, inputs: str, compile_s: float) -> Triage:
    clock, timer = _clock_of(values)
    started = time.perf_counter()
    figures = timed(thunder, inductor, timer, settings.deviation, settings.looks, settings.calls)
    return Triage(clock=clock, deviation=settings.deviation, calls_per_step=calls_per_step, inputs=inputs,
                  compile_s=compile_s, timing_s=time.perf_counter() - started, **figures)


class Triager:
    """The triage of one run's pieces, kept while each split's final traces stay the same objects."""

    def __init__(self):
        # split key -> (its trace objects, kept alive so that their ids stay theirs; the owner -> triage of the split
        # and its regions)
        self._done: dict[str, tuple[tuple, dict[str, Triage]]] = {}

    def known(self) -> dict[str, Triage]:
        """owner -> triage of the pieces triaged so far."""
        return {owner: t for _, results in self._done.values() for owner, t in results.items()}

    def triage(self, snapshots: Sequence[GraphSnapshot], settings: TriageSettings, failures: ReportingFailures,
               occasion: str = "the flush", unable: str | None = None) -> dict[str, Triage]:
        """owner -> triage of every thunder split (and at `fusion` region) of `snapshots` that ran: the pieces not
        triaged yet are timed now (`occasion` names the flush in what it says on stderr), or where this flush cannot
        time (`unable` says why) they carry that reason, and a later flush that can times them."""
        if settings.level is TriageLevel.OFF:
            return {}
        steps = min((s.state.calls for s in snapshots if s.state.calls > 0), default=0) or 1
        pending = []
        for snapshot in snapshots:
            for split in snapshot.splits:
                if split.state.split.kind is not SplitKind.THUNDER or split.fwd_trace is None or split.state.error:
                    continue
                key = f"{snapshot.state.name}/{split.state.name}"
                done = self._done.get(key)
                if done is None or done[0][0] is not split.fwd_trace or done[0][1] is not split.bwd_trace:
                    pending.append((key, snapshot, split, snapshot.state.calls / steps))
        if not pending:
            return self.known()
        if unable is not None:
            return {**self.known(), **{key: Triage(deviation=settings.deviation, calls_per_step=per_step,
                                                   error=unable) for key, _, _, per_step in pending}}
        regions = sum(len(split.regions) for _, _, split, _ in pending) if settings.level >= TriageLevel.FUSION else 0
        estimate = _estimate_s([split for _, _, split, _ in pending], settings)
        announce(f"thunderfx_debug: {occasion} times {_count(len(pending), 'Thunder split')}"
                 + (f" and {_count(regions, 'fusion region')}" if regions else "")
                 + f" against inductor in this process (THUNDERFX_DEBUG_TRIAGE={settings.level.name.lower()})"
                 + (f", about {estimate:.0f} s" if estimate is not None else "") + "; training waits meanwhile")
        SPANS.install()  # Dynamo's recompiles are how a region that compiled again shows (`counterparts`)
        _warm_compile_workers(failures)
        started = time.perf_counter()
        for key, snapshot, split, per_step in pending:
            results: dict[str, Triage] = {}
            with failures.guard(f"triaging {key}"):
                results = self._split(key, snapshot, split, settings, per_step, failures)
            self._done[key] = ((split.fwd_trace, split.bwd_trace), results)
        found = [t for key, *_ in pending for t in self._done[key][1].values()]
        log.info("thunderfx_debug: the triage took %.1f s (%d pieces: %d judged, %d deviate, %d not judged)",
                 time.perf_counter() - started, len(found), sum(t.error is None for t in found),
                 sum(t.deviates for t in found), sum(t.error is not None for t in found))
        return self.known()

    def _split(self, key: str, snapshot: GraphSnapshot, split: SplitSnapshot, settings: TriageSettings,
               per_step: float, failures: ReportingFailures) -> dict[str, Triage]:
        results: dict[str, Triage] = {}
        with kept_random_state(()), _RunsAs.recorded(split.state.captured):
            try:
                results[key] = self._split_verdict(snapshot, split, settings, per_step)
            except NotJudged as e:
                results[key] = Triage(deviation=settings.deviation, calls_per_step=per_step, error=str(e))
        if settings.level >= TriageLevel.FUSION:
            for region in split.regions:
                owner = f"{key}/{region.key}"
                with failures.guard(f"triaging {owner}"), kept_random_state(()), _RunsAs.inside_a_trace():
                    try:
                        results[owner] = self._region_verdict(split, region, settings, per_step)
                    except NotJudged as e:
                        results[owner] = Triage(deviation=settings.deviation, calls_per_step=per_step, error=str(e))
        return results

    @staticmethod
    def _split_verdict(snapshot: GraphSnapshot, split: SplitSnapshot, settings: TriageSettings,
                       per_step: float) -> Triage:
        compiled, original = split.state.split.compiled, split.state.split.original_module
        metas = repro_inputs.split_metas(snapshot, split)
        args, kind = _made_inputs(split.state.captured, metas, split.state.split.input_names)
        refused = counterparts.refusal(compiled, args)
        if refused is not None:
            raise NotJudged("Thunder would compile the split again for the triage's inputs: its prologue refuses "
                            f"them ({refused}); a bug of thunderfx_debug's inputs")
        started = time.perf_counter()
        try:
            inductor = torch_private.inductor_compile(original, args)
        except Exception as e:
            raise NotJudged(_because("inductor could not compile the split", e)) from e
        grad_outputs = split.state.captured.grad_outputs if split.state.captured is not None else None
        thunder_call, inductor_call = TrainingCall(compiled, args, grad_outputs), TrainingCall(inductor, args,
                                                                                               grad_outputs)
        _first_calls(thunder_call, inductor_call, compiled, split.regions, "the split")
        return _judge(thunder_call, inductor_call, args, settings, per_step, kind, time.perf_counter() - started)

    @staticmethod
    def _region_verdict(split: SplitSnapshot, region, settings: TriageSettings, per_step: float) -> Triage:
        metas = repro_inputs.region_metas(split, region)
        args, kind = _made_inputs(split.region_captures.get(region.key), metas, region.inputs)
        try:
            thunder = counterparts.region_callable(region)
        except LookupError as e:
            raise NotJudged(str(e)) from e
        started = time.perf_counter()
        try:
            inductor = counterparts.inductor_region(region)
        except Exception as e:
            raise NotJudged(_because("the region's ops could not be made torch calls for inductor", e)) from e
        thunder_call, inductor_call = _no_grad(thunder, args), _no_grad(inductor, args)
        _first_calls(thunder_call, inductor_call, None, [region], "the region")
        return _judge(thunder_call, inductor_call, args, settings, per_step, kind, time.perf_counter() - started)


def _made_inputs(captured: Captured | None, metas, names) -> tuple[list[Any], str]:
    try:
        return piece_inputs.call_inputs(captured, metas, names)
    except Exception as e:
        raise NotJudged(_because("the triage could not make the inputs", e)) from e


def _estimate_s(splits: Sequence[SplitSnapshot], settings: TriageSettings) -> float | None:
    """Seconds the triage of `splits` should take, from the run's own figures: inductor compiling each piece about as
    long as Thunder's first call of it took (its compile; regions about as long again), and the most rounds of both
    sides at the piece's median sampled call. None where the run timed no first call."""
    total, known = 0.0, False
    calls = 2 * (settings.looks[-1] * settings.calls + 2)
    for split in splits:
        first = split.state.first
        if first is not None and first.forward.samples_ms:
            known = True
            factor = 2 if settings.level >= TriageLevel.FUSION and split.regions else 1
            total += factor * (sum(first.forward.samples_ms) + sum(first.backward.samples_ms)) / 1e3
        sampled = [statistics.median(s.samples_ms) for s in (split.state.forward, split.state.backward) if s.samples_ms]
        total += calls * sum(sampled) / 1e3
    return total if known else None


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def announce(message: str) -> None:
    """`message` at INFO on the package's logger, and on stderr too where logging is not set up (no handler on the
    logger's path) and the logger was not silenced (a level above INFO set on it, or `logging.disable`): a flush that
    makes training wait says so once, where a training script shows it. A script that set up logging gets the record
    where its logging sends INFO (or not at all, at WARNING)."""
    log.info(message)
    silenced = log.level > logging.INFO or log.disabled or logging.root.manager.disable >= logging.INFO
    if not log.hasHandlers() and not silenced:
        print(message, file=sys.stderr, flush=True)


def _warm_compile_workers(failures: ReportingFailures) -> None:
    """Starts inductor's pool of compile workers before the first counterpart is compiled (its kernels then build in
    parallel, and the pool's start-up overlaps the first graph's lowering)."""
    with failures.guard("starting inductor's compile workers"):
        torch_private.warm_inductor_compile_workers()


def deviating(triage: TriageIndex) -> dict[str, str]:
    """owner -> why ("slower_than_inductor", "faster_than_inductor") for the pieces that deviate."""
    return {owner: t.why for owner, t in triage.items() if t.why is not None}
