"""Wrapping a compiled graph for the training path: the `GraphRunner` handed to Dynamo, a `SplitRunner` in place of
each split, samplers as the timing level asks, and the fusion-level instrumentation of Thunder's traces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.settings.config import CheckLevel, Config, Inputs, ReproKind, TimingLevel, TriageLevel
from thunderfx_debug.records import SplitKind
from thunderfx_debug.recording.capture import InputCapture, RegionCapture
from thunderfx_debug.recording.check import (
    CheckedCalls, CheckSchedule, CheckTally, EvidenceKeeper, TimingBesideChecks,
)
from thunderfx_debug.recording.compile_cost import FirstCallTimer
from thunderfx_debug.recording.host import HostWatch, host_series
from thunderfx_debug.recording.isolation import CheckIsolation
from thunderfx_debug.recording.memory import GraphMemory, MemoryMeter, MemoryProbe
from thunderfx_debug.recording.periodic import PeriodicFlush
from thunderfx_debug.recording.recorder import GraphState
from thunderfx_debug.recording.region_check import RegionCheck
from thunderfx_debug.recording.regions import RegionObservers
from thunderfx_debug.recording.runners import (
    BackwardWatch, GraphErrorHandler, GraphRunner, SplitRunner, ThunderOverhead,
)
from thunderfx_debug.recording.sampler import PhaseSampler, TimedCalls
from thunderfx_debug.recording.split_check import SplitCheck
from thunderfx_debug.recording.timing import (
    CudaClock, DeviceHold, HostClock, Ranges, RegionTimer, SampleSeries, Sampling,
)
from thunderfx_debug.recording.turns import OrdinaryPeriods, Turns
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import instrument
from thunderfx_debug.thunder.compile_events import SPANS
from thunderfx_debug.thunder.reference import RegionReferences


def _compiles_started() -> int:
    return SPANS.started


def _host_series(state: GraphState) -> tuple[SampleSeries | None, SampleSeries | None]:
    """Host-clock series for the wall time beside device time; none where the piece's clock is the host's."""
    if isinstance(state.clock, HostClock):
        return None, None
    return host_series(), host_series()


def call_schedules(config: Config) -> tuple[Sampling | TimingBesideChecks, CheckSchedule | None]:
    """Which graph calls the runners time (and measure memory on, `memory.measures`) and which they check: the
    one place these are decided from the settings (the runners', and `ReportingBackend.is_sampled` / `is_checked`)."""
    sampling = Sampling(config.timing_every, config.timing_warmup, enabled=config.timing >= TimingLevel.GRAPH)
    if config.check <= CheckLevel.OFF:
        return sampling, None
    schedule = CheckSchedule(config.check_every)
    return TimingBesideChecks(sampling, schedule), schedule  # a checked call is not timed (its check would be)


@dataclasses.dataclass(frozen=True)
class RunShared:
    """What every graph of one backend's run shares, built once by the backend: its settings and the failures of its
    reporting; the capture of inputs (None: none); what happens when Thunder fails on a graph (`on_error`); what runs
    once a graph's first call has returned (`after_first_call(state)`; reporting: failures logged); the periodic
    flush's trigger (None without one); where the correctness checks run (`isolation`: their pools and stream on
    CUDA); which scheduled calls each split checks (`check_turns`, THUNDERFX_DEBUG_CHECK_SHARE) and which sampled
    calls each graph times (`timing_turns`, THUNDERFX_DEBUG_TIMING_SHARE); and what measures the memory the graphs and
    splits hold on sampled calls (`memory`; None: not measured)."""

    config: Config
    failures: ReportingFailures
    capture: InputCapture | None
    on_error: GraphErrorHandler
    after_first_call: Callable[[GraphState], None] | None = None
    periodic: PeriodicFlush | None = None
    isolation: CheckIsolation | None = None
    memory: MemoryProbe | None = None
    check_turns: Turns | None = None
    timing_turns: Turns | None = None


def wrap_graph(state: GraphState, split_gm: torch.fx.GraphModule, shared: RunShared) -> GraphRunner:
    """The callable to hand Dynamo for `state`'s compiled `split_gm` (whose splits it replaces with runners), with
    what the run's graphs share (`RunShared`).

    Wrapping is reporting: a failure here is logged and leaves the splits that were not wrapped as Thunder made them.
    """
    config, failures, capture, on_error = shared.config, shared.failures, shared.capture, shared.on_error
    after_first_call, periodic, isolation, memory = (shared.after_first_call, shared.periodic, shared.isolation,
                                                     shared.memory)
    turns, timing_turns = shared.check_turns, shared.timing_turns
    level = config.timing
    timed = level >= TimingLevel.GRAPH
    sampling, schedule = call_schedules(config)
    evidence = None
    if schedule is not None:
        isolation = isolation if isolation is not None else CheckIsolation()
        turns = turns if turns is not None else Turns(config.check_share)
        evidence = EvidenceKeeper(config.inputs_max_mb, failures)
    hold = None
    if level >= TimingLevel.FUSION and isinstance(state.clock, CudaClock):
        # Fusion-level timing on CUDA holds the device back on sampled calls, so that region marks time kernels
        # rather than waits for the host's launches (see `timing.DeviceHold`).
        with failures.guard(f"preparing the fusion timing of {state.name}"):
            hold = DeviceHold.for_current_cuda_device()
    # A graph's ordinary calls' periods, against which its timed and checked calls are charged within a share.
    periods = OrdinaryPeriods()
    timed_calls = checked_calls = None
    if timed and config.timing_share < 100:
        timing_turns = timing_turns if timing_turns is not None else Turns(config.timing_share)
        state.timed_calls = timed_calls = TimedCalls(timing_turns.join(), hold, periods)
    if schedule is not None and config.check_share < 100:
        checked_calls = CheckedCalls(schedule, [], periods)
    split_meters: list[MemoryMeter] = []
    thunder_runners: list[SplitRunner] = []  # told of a failure of the graph's backward (`GraphRunner`)
    if not timed:
        memory = None
    elif memory is not None and isinstance(state.clock, CudaClock):
        with failures.guard(f"preparing the memory sampling of {state.name}"):
            memory.for_device(torch.device(next(m.device for m in state.input_meta if m.device.startswith("cuda"))))
    with failures.guard(f"wrapping the splits of {state.name}"):
        for split in state.splits:
            label = PieceKey.of(state.name, split.name)
            sampler = overhead = first = None
            if level >= TimingLevel.SPLIT:
                split.host_forward, split.host_backward = _host_series(state)
                watch = None  # on CPU a split's own clock is the host's: nothing more to read
                if split.host_forward is not None:
                    watch = HostWatch(split.host_forward, split.host_backward, None, _compiles_started)
                sampler = PhaseSampler(label, split.forward, split.backward, failures, hold, owns_hold=False,
                                       watch=watch, timed=timed_calls)
                if split.split.kind is SplitKind.THUNDER:
                    split.overhead = host_series()
                    overhead = ThunderOverhead(split.split.compiled, split.overhead, failures, label)
            if timed:
                first = FirstCallTimer(label, failures, split.split.kind, split.split.compiled)
                split.first = first.first
            meter = None
            if memory is not None:
                meter = MemoryMeter(label, memory, split.memory, failures)
                split_meters.append(meter)
            runner = SplitRunner(split.split.compiled, split, state, sampling, sampler, capture, first, overhead,
                                 meter)
            setattr(split_gm, split.name, runner)
            if split.split.kind is not SplitKind.THUNDER:
                continue
            runner.backward_watch = BackwardWatch(split.split.compiled, failures, label, runner.backward_failed)
            thunder_runners.append(runner)
            observers = []  # of the split's fusion regions, the timer last (see `RegionObservers`)
            if ReproKind.FUSION in config.repro or config.triage >= TriageLevel.FUSION:  # triage times regions on
                # the inputs of their first call
                capture_regions = RegionCapture(PieceKey.of(state.name, split.name), config.inputs is Inputs.REAL,
                                                config.inputs_max_mb, failures,
                                                references=config.triage >= TriageLevel.FUSION)
                split.region_captures = capture_regions.captures
                observers.append(capture_regions)
            if schedule is not None:
                with failures.guard(f"preparing the correctness check of {label}"):
                    regions = None
                    split.check = CheckTally()
                    split.check.turn = turn = turns.join()
                    if checked_calls is not None:
                        checked_calls.turns.append(turn)
                    if config.check >= CheckLevel.FUSION:
                        regions = RegionCheck(label, RegionReferences(split.split.compiled), split.region_checks,
                                              failures, evidence, split.check, isolation, turn)
                        observers.append(regions)
                    runner.check = SplitCheck(label, split.split.original_module, split.split.input_names, schedule,
                                              split.check, failures, evidence, regions, isolation, turn,
                                              compiled=split.split.compiled)
            if level >= TimingLevel.FUSION or config.nvtx:  # NVTX ranges also work without fusion timing
                ranges = (Ranges(), label) if config.nvtx else None
                timer = RegionTimer(state.clock, split.region_series, ranges, split.op_series, split.op_counts,
                                    hold=hold, failures=failures, label=label)
                split.region_timer = timer
                if level >= TimingLevel.FUSION:
                    runner.attach_regions(timer)
                observers.append(timer)
            if observers:
                # Ops are marked only where their time is recorded: every mark costs a call on every run.
                instrument.attach(split.split.compiled,
                                  observers[0] if len(observers) == 1 else RegionObservers(observers),
                                  mark_ops=level >= TimingLevel.FUSION)
    sampler = first = None
    if timed:
        state.host_forward, state.host_backward = _host_series(state)
        watch = HostWatch(state.host_forward, state.host_backward, state.waits, _compiles_started)
        sampler = PhaseSampler(state.name, state.forward, state.backward, failures, hold, watch=watch,
                               timed=timed_calls)
        first = FirstCallTimer(state.name, failures)
        state.first = first.first
    if after_first_call is not None:
        after_first_call = _guarded(after_first_call, failures, f"reporting the first call of {state.name}")
    graph_memory = None
    if memory is not None:
        with failures.guard(f"preparing the memory sampling of {state.name}"):
            graph_memory = GraphMemory(MemoryMeter(state.name, memory, state.memory, failures,
                                                   constants=list(state.gm.parameters()), step=True), split_meters)
    runner = GraphRunner(state, split_gm, sampling, sampler, capture, on_error, after_first_call, periodic, first,
                         graph_memory, timed_calls, checked_calls)
    for split_runner in thunder_runners:
        split_runner.on_backward_failure = runner.backward_failed
    return runner


def _guarded(hook: Callable[[GraphState], None], failures: ReportingFailures, what: str) -> Callable[[GraphState], None]:
    def guarded(state: GraphState) -> None:
        with failures.guard(what):
            hook(state)

    return guarded
