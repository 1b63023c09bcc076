"""Flush-time triage in the training process (THUNDERFX_DEBUG_TRIAGE): each Thunder split, and at `fusion` each of its
fusion regions, timed against the same piece compiled by inductor, on the inputs of a recorded call.

What is timed:
- a split: the ThunderModule the run compiled, called with grad enabled and its backward run by `torch.autograd.grad`
  (no `.grad` of the run's parameters is touched, and Thunder finds its cache entry: a call under no_grad would make
  it compile again), against `torch._inductor.compile` of the split's original FX module (autograd included, its
  backward compiled at its first call);
- a fusion region: the callable Thunder's final trace calls (nvFuser's, or the torch.compile executor's), against
  torch.compile(fullgraph=True) of the region's ops as torch calls, both under no_grad.
Inputs are the run's own where they were captured (THUNDERFX_DEBUG_INPUTS=real), else rebuilt from the recorded
metadata exactly as the repro scripts rebuild them (same layout, values drawn like the run's).

How: `ROUNDS` rounds, each timing `CALLS` back-to-back calls of each side, the order alternating every round, so that
drift (clock boost, other processes, a cache that warms) hits both sides alike. A round's time is the median of its
calls on the host clock (a preempted call moves one call, not the round), or on CUDA the events around all its calls
queued behind a spin kernel (`DeviceHold`), so that the device's time for the kernels is measured, not the host's
launches. The ratio Thunder/inductor and its 95% interval come from Yuen's trimmed t on the rounds' log times
(`render.noise.yuen`); a piece deviates when the whole interval lies beyond THUNDERFX_DEBUG_DEVIATION either way.

Inductor's counterparts are compiled with its compile workers started first (`AsyncCompile.warm_pool`: kernels of a
graph build in parallel), and dropped after the piece is timed. Results are kept per piece while its final traces stay
the same objects, so a later flush of the same run times nothing again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.config import TriageLevel
from thunderfx_debug.records import ClockKind, InputKind, InputMeta, SplitKind, Triage
from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot
from thunderfx_debug.render import noise
from thunderfx_debug.safety import ReportingFailures, describe_exception
from thunderfx_debug.thunder import counterparts
from thunderfx_debug.thunder import scripts as thunder_scripts

log = logging.getLogger("thunderfx_debug")

#: Timing rounds per piece (alternating which side goes first) and calls per side in each round.
ROUNDS = 21
CALLS = 9
#: The 95% interval of the ratio.
CONFIDENCE = 0.95

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
    """Device ms per call of `calls` back-to-back calls: queued behind a spin kernel long enough that the host's
    launches stay ahead of the device, timed with CUDA events; synchronises once per round (at flush, not training)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()  # a host estimate of one call, to size the hold
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - started) * 1e3
    cycles_per_ms = float(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0)
                          or 1_500_000)
    torch.cuda._sleep(int(min(max(1.5 * host_ms * calls, 0.5), 2000.0) * cycles_per_ms))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def interleaved(thunder: Callable[[], Any], inductor: Callable[[], Any], timer: RoundTimer = host_round,
                rounds: int = ROUNDS, calls: int = CALLS) -> tuple[list[float], list[float]]:
    """Per-round ms per call of each side, the side that goes first alternating every round.

    Example (a fake round timer that says which side ran):
        >>> interleaved(lambda: 2.0, lambda: 1.0, timer=lambda call, calls: call(), rounds=2)
        ([2.0, 2.0], [1.0, 1.0])
    """
    thunder_ms: list[float] = []
    inductor_ms: list[float] = []
    for r in range(rounds):
        sides = ((thunder, thunder_ms), (inductor, inductor_ms))
        for call, out in sides if r % 2 == 0 else sides[::-1]:
            out.append(timer(call, calls))
    return thunder_ms, inductor_ms


def verdict(thunder_ms: Sequence[float], inductor_ms: Sequence[float], deviation: float) -> dict[str, Any]:
    """Ratio Thunder/inductor, its 95% interval, and whether it deviates beyond `deviation`, from per-round times.

    Example:
        >>> v = verdict([3.0, 3.1, 2.9, 3.0, 3.05], [1.0, 1.02, 0.98, 1.0, 1.01], 1.2)
        >>> round(v["ratio"], 1), v["deviates"], round(v["thunder_ms"], 2)
        (3.0, True, 3.0)
    """
    logs_thunder = [math.log(x) for x in thunder_ms if x > 0]
    logs_inductor = [math.log(x) for x in inductor_ms if x > 0]
    difference, error, df = noise.yuen(logs_inductor, logs_thunder)  # log(thunder) - log(inductor)
    half = noise.t_isf((1 - CONFIDENCE) / 2, max(df, 1.0)) * error
    low, high = math.exp(difference - half), math.exp(difference + half)
    return {
        "thunder_ms": statistics.median(thunder_ms), "inductor_ms": statistics.median(inductor_ms),
        "ratio": math.exp(difference), "ratio_low": low, "ratio_high": high,
        "deviates": low > deviation or high < 1 / deviation, "rounds": len(thunder_ms),
    }


def _clock_of(values: Sequence[Any]) -> tuple[ClockKind, RoundTimer]:
    on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)
    return (ClockKind.CUDA, cuda_round) if on_cuda else (ClockKind.HOST, host_round)


# ---- inputs ---------------------------------------------------------------------------------------------------------
def rebuilt_inputs(metas: Sequence[InputMeta], names: Sequence[str] = ()) -> list[Any]:
    """Inputs made from recorded metadata, by the code the repro scripts run (`repro.inputs.make_inputs_code` with
    `script_template.tensor`): the run's layouts, values drawn like the run's."""
    body = repro_inputs.make_inputs_code(metas, names)
    source = "def make_inputs():\n" + "".join(f"    {line}\n" for line in body.splitlines())
    namespace: dict[str, Any] = {"torch": torch, "tensor": script_template.tensor}
    exec(compile(source, "<triage inputs>", "exec"), namespace)
    torch.manual_seed(script_template.SEED)
    return _as_parameters(namespace["make_inputs"](), metas)


def _as_parameters(values: Sequence[Any], metas: Sequence[InputMeta]) -> list[Any]:
    """Parameters where the run passed parameters: compiled regions guard on the type (a plain tensor would make
    them compile again). A tensor that requires grad and is a view of a storage made for it (how inputs are rebuilt)
    becomes a tensor of its own with the same strides: inside a Thunder split such a view reaches the regions without
    requires_grad, and the torch.compile executor's regions, which guard on it, would compile again."""
    out = []
    for v, m in zip(values, metas):
        if isinstance(v, torch.Tensor) and v.requires_grad and v._base is not None:
            own = v.detach().clone(memory_format=torch.preserve_format)
            if own.stride() == v.stride():  # dense views keep their layout; others stay as they are
                v = own.requires_grad_()
        if m.parameter and isinstance(v, torch.Tensor):
            v = torch.nn.Parameter(v, requires_grad=v.requires_grad)
        out.append(v)
    return out


def _unresolvable(metas: Sequence[InputMeta]) -> str | None:
    for i, meta in enumerate(metas):
        if meta.kind is InputKind.OTHER:
            return f"input {i} ({meta.value}) cannot be rebuilt from its metadata"
    return None


def _inputs(captured, metas: Sequence[InputMeta], names: Sequence[str]) -> tuple[list[Any], str]:
    """(inputs, "real" | "meta" | "meta, run's parameters"): the captured tensors where the run kept them, else
    rebuilt from `metas`; the run's own parameters wherever they are still alive and laid out as when captured."""
    if captured is not None and captured.inputs is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the capture's non-blocking host copies are complete from here on
        values, kind = _as_parameters([script_template._rebuild(x) for x in captured.inputs], captured.observed), "real"
    else:
        why = _unresolvable(metas)
        if why is not None:
            raise ValueError(why)
        values, kind = rebuilt_inputs(metas, names), "meta"
    live = 0
    for i, ref in (captured.parameters.items() if captured is not None else ()):
        parameter, made = ref(), values[i] if i < len(values) else None
        if (parameter is not None and isinstance(made, torch.Tensor) and parameter.shape == made.shape
                and parameter.stride() == made.stride() and parameter.dtype == made.dtype):
            values[i] = parameter  # read only: the split's backward goes through autograd.grad, not .grad
            live += 1
    return values, kind if not live or kind == "real" else f"{kind}, the run's parameters"


# ---- the pieces -----------------------------------------------------------------------------------------------------
def forward_backward(fn: Callable, args: Sequence[Any]) -> None:
    """A training-like call: forward with grad, and the gradients of the inputs that require one (not accumulated
    into `.grad`), with ones as the incoming gradients."""
    outputs = [o for o in tree_leaves(fn(*args)) if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if outputs and wanted:
        torch.autograd.grad(outputs, wanted, [torch.ones_like(o) for o in outputs], allow_unused=True)


def _no_grad(fn: Callable, args: Sequence[Any]) -> Callable[[], Any]:
    def call():
        with torch.no_grad():
            return fn(*args)

    return call


@dataclasses.dataclass(frozen=True)
class TriageSettings:
    level: TriageLevel = TriageLevel.OFF
    deviation: float = 1.2
    rounds: int = ROUNDS
    calls: int = CALLS


def _judge(thunder: Callable[[], Any], inductor: Callable[[], Any], values: Sequence[Any], settings: TriageSettings,
           calls_per_step: float, inputs: str) -> Triage:
    clock, timer = _clock_of(values)
    thunder(), inductor()  # first calls: inductor compiles lazily (a split's backward at its first backward)
    thunder_ms, inductor_ms = interleaved(thunder, inductor, timer, settings.rounds, settings.calls)
    figures = verdict(thunder_ms, inductor_ms, settings.deviation)
    return Triage(clock=clock, deviation=settings.deviation, calls_per_step=calls_per_step, inputs=inputs, **figures)


class Triager:
    """The triage of one run's pieces, kept while each split's final traces stay the same objects."""

    def __init__(self):
        # split key -> (its trace objects, kept alive so that their ids stay theirs; the owner -> triage of the split
        # and its regions)
        self._done: dict[str, tuple[tuple, dict[str, Triage]]] = {}

    def known(self) -> dict[str, Triage]:
        """owner -> triage of the pieces triaged so far."""
        return {owner: t for _, results in self._done.values() for owner, t in results.items()}

    def triage(self, snapshots: Sequence[GraphSnapshot], settings: TriageSettings,
               failures: ReportingFailures) -> dict[str, Triage]:
        """owner -> triage of every thunder split (and at `fusion` region) of `snapshots` that ran."""
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
                    pending.append((key, snapshot, split))
        if pending:
            _warm_compile_workers(failures)
            started = time.perf_counter()
            for key, snapshot, split in pending:
                per_step = snapshot.state.calls / steps
                results: dict[str, Triage] = {}
                with failures.guard(f"triaging {key}"):
                    results = self._split(key, snapshot, split, settings, per_step, failures)
                self._done[key] = ((split.fwd_trace, split.bwd_trace), results)
            log.info("thunderfx_debug: triage of %d thunder split(s) took %.1f s", len(pending),
                     time.perf_counter() - started)
        return self.known()

    def _split(self, key: str, snapshot: GraphSnapshot, split: SplitSnapshot, settings: TriageSettings,
               per_step: float, failures: ReportingFailures) -> dict[str, Triage]:
        from thunderfx_debug.artifacts.repro.builder import ScriptBuilder
        from thunderfx_debug.artifacts.artifact import ArtifactSettings

        results: dict[str, Triage] = {}
        compiled = split.state.split.compiled
        metas = ScriptBuilder(snapshot, ArtifactSettings(), failures).split_metas(split)
        try:
            args, kind = _inputs(split.state.captured, metas, split.state.split.input_names)
            misses = counterparts.cache_misses(compiled)
            inductor = torch._inductor.compile(split.state.split.original_module, list(args))
            results[key] = _judge(lambda: forward_backward(compiled, args), lambda: forward_backward(inductor, args),
                                  args, settings, per_step, kind)
            if counterparts.cache_misses(compiled) != misses:
                results[key] = dataclasses.replace(
                    results[key], deviates=False,
                    error="Thunder compiled the split again for the triage's inputs: they differ from the run's")
            del inductor
        except Exception as e:
            results[key] = Triage(deviation=settings.deviation, calls_per_step=per_step,
                                  error=describe_exception(e)[:400])
        if settings.level >= TriageLevel.FUSION:
            for region in split.regions:
                owner = f"{key}/{region.key}"
                with failures.guard(f"triaging {owner}"):
                    results[owner] = self._region(split, region, settings, per_step)
        return results

    @staticmethod
    def _region(split: SplitSnapshot, region, settings: TriageSettings, per_step: float) -> Triage:
        # requires_grad stays as the run passed it (under no_grad): the torch.compile executor's regions guard on
        # it, and inputs without it would make them compile again.
        metas = repro_inputs.with_index_bounds(split.region_metas(region),
                                               thunder_scripts.region_index_bounds(region.bsym))
        try:
            args, kind = _inputs(split.region_captures.get(region.key), metas, region.inputs)
            thunder = counterparts.region_callable(region)
            inductor = counterparts.inductor_region(region)
            return _judge(_no_grad(thunder, args), _no_grad(inductor, args), args, settings, per_step, kind)
        except Exception as e:
            return Triage(deviation=settings.deviation, calls_per_step=per_step, error=describe_exception(e)[:400])


def _warm_compile_workers(failures: ReportingFailures) -> None:
    """Starts inductor's pool of compile workers before the first counterpart is compiled (its kernels then build in
    parallel, and the pool's start-up overlaps the first graph's lowering)."""
    with failures.guard("starting inductor's compile workers"):
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()


def deviating(triage: TriageIndex) -> dict[str, str]:
    """owner -> why ("slower_than_inductor", "faster_than_inductor") for the pieces that deviate."""
    return {owner: t.why for owner, t in triage.items() if t.why is not None}
