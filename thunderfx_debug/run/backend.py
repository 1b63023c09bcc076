"""The torch.compile entry point: ThunderFX with a report of what it did."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from thunder.dynamo import ThunderCompiler

from thunderfx_debug.artifacts.artifact import ArtifactSettings
from thunderfx_debug.artifacts.report_builder import FlushFindings, build_report
from thunderfx_debug.artifacts.torch_trace import TorchTraceEmitter
from thunderfx_debug.settings.config import (
    OWN_OPTIONS, Config, ConfigError, Inputs, TriageLevel, load_config, misspelt_option,
)
from thunderfx_debug.dump.files import check_writable
from thunderfx_debug.run.flusher import DumpFlusher, FlushStats
from thunderfx_debug.minimize.at_flush import MinimizeSettings
from thunderfx_debug.recording.manifest import run_facts
from thunderfx_debug.recording.capture import InputCapture
from thunderfx_debug.recording.collectives import read_flight_recorder
from thunderfx_debug.recording.fallback import GraphFailureHandler
from thunderfx_debug.recording.turns import Turns
from thunderfx_debug.recording.isolation import CheckIsolation
from thunderfx_debug.recording.periodic import PeriodicFlush
from thunderfx_debug.recording.recorder import Recorder
from thunderfx_debug.recording.wrap import RunShared, call_schedules, wrap_graph
from thunderfx_debug.records import SplitKind
from thunderfx_debug.render.report import Report
from thunderfx_debug.dump.runs import this_run
from thunderfx_debug.run.sigterm import chain_sigterm
from thunderfx_debug.triage.judging import TriageSettings
from thunderfx_debug.triage.at_flush import announce_cost
from thunderfx_debug.thunder.compile import compile_graph, has_dynamic_inputs
from thunderfx_debug.thunder.options import THUNDERFX_OWN_OPTIONS, describe_options, jit_arguments, unread_options
from thunderfx_debug.thunder.torch_trace import tracing_enabled
from thunderfx_debug.thunder.workarounds import make_inductor_compile

log = logging.getLogger("thunderfx_debug")


class ReportingBackend(ThunderCompiler):
    """A drop-in `torch.compile` backend: compiles every Dynamo graph with ThunderFX exactly as
    `thunder.dynamo.ThunderCompiler` does, and records how ThunderFX split it, what it fused and what it costs.

    Args:
        dump_dir: where `flush()` writes the dump (`<dump_dir>/rank<R>/...`); THUNDERFX_DEBUG_DIR wins over it
            (with a warning naming both when they differ).
            Without either, nothing is written and `report()` is the way to read the records.
        **options: thunderfx_debug's own settings by their lower-case names (`repro`, `inputs`, `inputs_max_mb`,
            `timing`, `timing_every`, `timing_warmup`, `ranks`, `on_error`, `strict`, `nvtx`, `flush_every`, `check`,
            `check_every`; see `thunderfx_debug.settings.config`, the environment variables win), and everything
            else goes to Thunder as ThunderCompiler's options do (`executors=...`, `transforms=...`).

    With a dump directory, the dump is written every `flush_every` seconds during training (from the training
    thread, between two graph calls; serialising and writing in a writer thread), at interpreter exit, and on
    SIGTERM (a handler installed from the main thread, which flushes and then runs the handler installed before
    it, or SIGTERM's default action). A run restarted into the same directory moves the earlier run's dump to
    `runs/<its run id>/` (see `thunderfx_debug.dump.runs`).

    With torch's trace log on (TORCH_TRACE), the records also go into it, for tlparse
    (`thunderfx_debug.artifacts.torch_trace`).

    Example (usage, not a doctest):

        backend = ReportingBackend(executors=[torch_compile_ex, *thunder.get_default_executors()])
        model = torch.compile(model, backend=backend)
        ...  # train
        print(backend.report())

    Raises:
        ConfigError: a setting (argument or environment variable) has a value that is not allowed, or the dump
            directory cannot be written. Raised here, before training starts.
    """

    def __init__(self, dump_dir: str | os.PathLike | None = None, **options: Any):
        own = {k: options.pop(k) for k in list(options) if k in OWN_OPTIONS}
        if dump_dir is not None:
            own["dump_dir"] = dump_dir
        self.config: Config = load_config(own)
        self._schedules = call_schedules(self.config)  # which calls time and check (`is_sampled`, `is_checked`)
        # Options for Thunder are Thunder's to read, at its first compile: a near miss of one of ours is certain
        # enough to refuse now; others are named after the first call if nothing read them (`_check_options`).
        self._unchecked_options = set(options) - jit_arguments() - THUNDERFX_OWN_OPTIONS
        for name in sorted(self._unchecked_options):
            ours = misspelt_option(name)
            if ours is not None:
                raise ConfigError(f"ReportingBackend({name}=...) is neither a thunderfx_debug option nor one Thunder "
                                  f"takes: did you mean {ours}=...?")
        _current_rank()  # a malformed RANK / LOCAL_RANK fails here, before training, not at the first compile
        super().__init__(**options)
        self.recorder = Recorder(self.config)
        # Every graph's and split's first call is captured: its inputs' metadata always (for the repro of a piece
        # that fails), what their values were where repro scripts are asked for, the tensors themselves with
        # THUNDERFX_DEBUG_INPUTS=real.
        self._capture = InputCapture(self.config.inputs is Inputs.REAL, self.config.inputs_max_mb,
                                     self.recorder.failures,
                                     statistics=bool(self.config.repro) or self.config.triage is not TriageLevel.OFF,
                                     references=self.config.triage is not TriageLevel.OFF)
        flush = self.flush if self.config.dump_dir is not None else None
        self._on_graph_error = GraphFailureHandler(self.recorder, self.config.on_error, self._capture, flush)
        self._rank: int | None = None
        self._world_size: int | None = None
        self._run = this_run()
        self._flusher: DumpFlusher | None = None
        self._periodic: PeriodicFlush | None = None
        self._collectives = None  # the last flight-recorder log read (see `recording.collectives`)
        self._closed = False
        self._built_ns = time.time_ns()  # the flight recorder's clock: the collectives from here on are this run's
        # With TORCH_TRACE on, the records also go into torch's trace log for tlparse; without it, nothing is made.
        self._torch_trace = TorchTraceEmitter(self.recorder) if tracing_enabled() else None
        if self.config.dump_dir is not None:
            check_writable(self.config.dump_dir)
            on_report = self._torch_trace.flushed if self._torch_trace is not None else None
            triage = TriageSettings(self.config.triage, self.config.deviation, timeout_s=self.config.triage_timeout,
                                    device_margin=self.config.device_margin)
            self._flusher = DumpFlusher(lambda: self.config.dump_dir, self.recorder, self._artifact_settings,
                                        lambda: self.rank, self._run_facts, self._run.process_uid, on_report,
                                        triage, MinimizeSettings(self.config.minimize, self.config.minimize_budget))
            announce_cost(triage)
            if self.config.flush_every > 0:
                self._periodic = PeriodicFlush(self.config.flush_every, self._flush_periodically)
            chain_sigterm(self._on_sigterm)
        self._shared = RunShared(self.config, self.recorder.failures, self._capture, self._on_graph_error,
                                 self._after_first_call, self._periodic, CheckIsolation(), self.recorder.memory,
                                 Turns(self.config.check_share), Turns(self.config.timing_share))
        if self.config.dump_dir is not None or self._torch_trace is not None:
            _flush_at_exit(self)

    # ---- which calls do more than run ------------------------------------------------------------------------------
    def is_sampled(self, call: int) -> bool:
        """Whether a graph's `call`-th call (1-based; in a training loop, the step's number) is timed, and its memory
        measured where `recording.memory.measures` says so: a step that costs more host time than the others (to
        leave out of your own step timing, or to know which steps a profile shows). With THUNDERFX_DEBUG_TIMING_SHARE
        below 100 such a call may yet be passed over, which only the call itself decides (the graph's record counts
        them)."""
        sampling, _ = self._schedules
        return sampling.is_sampled(call)

    def is_checked(self, call: int) -> bool:
        """Whether a graph's `call`-th call is checked by the correctness sentinel (THUNDERFX_DEBUG_CHECK): its
        pieces run again against their float64 references on the training thread, a step many times as long."""
        _, schedule = self._schedules
        return schedule is not None and schedule.is_checked(call)

    # ---- rank -----------------------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """The process's rank: torch.distributed's once initialised, else RANK (or LOCAL_RANK), else 0."""
        if self._rank is None:
            rank = _current_rank()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # Fixed from here on (before init the environment may still change); kept after the process group
                # is destroyed, for the flush at exit.
                self._rank, self._world_size = rank, torch.distributed.get_world_size()
            return rank
        return self._rank

    @property
    def world_size(self) -> int:
        """torch.distributed's world size, remembered with the rank; else WORLD_SIZE; else 1."""
        self.rank  # noqa: B018  (fixes both once torch.distributed is initialised)
        if self._world_size is not None:
            return self._world_size
        try:
            return int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError:
            return 1

    @property
    def recording(self) -> bool:
        return not self._closed and self.config.records_rank(self.rank)

    # ---- compile ------------------------------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, sample_args: list[Any]):
        dynamic = has_dynamic_inputs(sample_args)
        inductor_compile = make_inductor_compile(dynamic)
        if not self.recording:
            split_gm, info = compile_graph(gm, sample_args, self.thunder_options, inductor_compile)
            self.subgraph_infos.append(info)
            return split_gm
        state = self.recorder.new_graph(gm, sample_args)
        state.dynamic = dynamic
        if self._torch_trace is not None:
            self._torch_trace.graph_started(state)
        started = time.perf_counter()
        try:
            split_gm, info = compile_graph(gm, sample_args, self.thunder_options, inductor_compile)
        except Exception as e:
            return self._on_graph_error(state, e, sample_args)
        self.subgraph_infos.append(info)
        self.recorder.graph_compiled(state, info, split_gm, time.perf_counter() - started)
        if self._torch_trace is not None:
            self._torch_trace.graph_compiled(state)
        return wrap_graph(state, split_gm, self._shared)

    def _after_first_call(self, state) -> None:
        """Once a graph's first call has returned (Thunder has compiled its splits)."""
        if self._torch_trace is not None:
            self._torch_trace.graph_ran(state)
        self._check_options(state)

    def _check_options(self, state) -> None:
        """Warns once about options passed for Thunder that neither it nor ThunderFX read in compiling the first
        graph's Thunder splits (a typo, or an option of another Thunder version), with the closest known name."""
        if not self._unchecked_options:
            return
        compiled = [split.split.compiled for split in state.splits if split.split.kind is SplitKind.THUNDER]
        if not compiled:
            return
        options, self._unchecked_options = {k: self.thunder_options[k] for k in self._unchecked_options}, set()
        unread = unread_options(options, compiled, known=OWN_OPTIONS)
        if unread:
            named = ", ".join(f"{name!r}" + (f" (did you mean {close!r}?)" if close else "")
                              for name, close in unread.items())
            warnings.warn(f"thunderfx_debug: ReportingBackend passed these options to Thunder and nothing read them "
                          f"in compiling {state.name}: {named}; they have no effect with this Thunder version",
                          UserWarning, stacklevel=2)

    # ---- report -------------------------------------------------------------------------------------------------
    def report(self) -> Report:
        """The records so far (traces and fusions read now from what Thunder built). Does not synchronise the
        device: timing samples whose events are not complete yet are left for later."""
        snapshots = self.recorder.snapshot(wait=False)
        flushes = self._flusher.flushes if self._flusher is not None else 0
        findings = None if self._flusher is None else FlushFindings(self._flusher.triaged, self._flusher.minimized)
        return build_report(snapshots, {}, self._run_facts(flushes, None), self.recorder.failures, findings)

    def flush(self) -> Path | None:
        """Writes the dump to `<dump_dir>/rank<R>/` atomically and returns that directory (None without a dump
        dir, on a rank that does not record, or when writing failed: logged). Waits for outstanding timing events
        and for a periodic flush still being written. With TORCH_TRACE on, also writes what changed since the last
        flush into torch's trace log (timing statistics, checks); periodic flushes do too."""
        return self._flush_now("backend.flush()")

    def _flush_now(self, occasion: str, **why: str) -> Path | None:
        if not self.recording:
            return None
        if self._flusher is not None:
            return self._flusher.flush(wait_for_device=True, occasion=occasion, **why)
        if self._torch_trace is not None:
            failures = self.recorder.failures
            with failures.guard("writing the TORCH_TRACE artifacts"):
                self._torch_trace.flushed(build_report(self.recorder.snapshot(wait=True), {}, {}, failures).graphs)
        return None

    def close(self) -> Path | None:
        """Writes the dump a last time (as `flush()`) and stops recording: graphs compiled later are compiled
        without records, and later flushes (at exit, periodic, on SIGTERM) write nothing. For a process that trains
        several models one after another, each with its own backend, so that an earlier backend's dump stays as it
        was when its training ended."""
        try:
            return self._flush_now("backend.close()")
        finally:
            self._closed = True
            self.recorder.steps.stop()
            if self._flusher is not None:
                self._flusher.stop_compiling_ahead()  # graphs compiled later have no records to triage

    def wait_for_flush(self, timeout: float | None = None) -> bool:
        """Waits until a periodic flush still being written (in its writer thread) is on disk; False if it is still
        writing after `timeout` seconds. `flush()` waits for it by itself."""
        return self._flusher.wait(timeout) if self._flusher is not None else True

    @property
    def flush_history(self) -> list[FlushStats]:
        """What the recent flushes cost (the training thread's time, the writer's, files written and left), oldest
        first; the manifest of each flush records the one before it as `last_flush`."""
        return list(self._flusher.history) if self._flusher is not None else []

    def _artifact_settings(self) -> ArtifactSettings:
        return ArtifactSettings(self.config.repro, self.config.inputs is Inputs.REAL, dict(self.thunder_options))

    def _flush_periodically(self) -> bool:
        if not self.recording:
            return True
        return self._flusher.flush_in_background()

    def _on_sigterm(self, then) -> None:
        """SIGTERM: the dump, then what SIGTERM did before (see `sigterm`). Not waiting for the device: a job is
        often terminated because a collective hangs, and a flush that waited would keep it from ending."""

        def flush_then_chain():
            try:
                if self.recording:
                    self._flusher.flush(wait_for_device=False, occasion="the dump at SIGTERM")
            except Exception as e:  # strict mode: still end as SIGTERM asks
                log.warning("thunderfx_debug: the dump at SIGTERM failed: %s", e)
            then()

        if not self._flusher.in_its_process:  # a forked child (a DataLoader worker) inherited the handler
            then()
        else:
            self._flusher.after_flush(flush_then_chain)

    def _run_facts(self, flushes: int, last_flush: FlushStats | None) -> dict[str, Any]:
        failures = self.recorder.failures
        facts: dict[str, Any] = {"rank": self.rank}
        with failures.guard("collecting the run's versions, settings and environment"):
            thunder_options: dict[str, str] = {}
            try:
                thunder_options = describe_options(self.thunder_options)
            except Exception as e:  # options thunder cannot resolve are still worth showing
                thunder_options = {"error": repr(e)}
            facts = run_facts(rank=self.rank, world_size=self.world_size, config=self.config.to_json(),
                              thunder_options=thunder_options, warnings=self.recorder.warnings, failures=failures,
                              flushes=flushes)
        facts.update(run_id=self._run.run_id, run_started_at=self._run.started_at, process_uid=self._run.process_uid)
        with failures.guard("reading torch.distributed's flight recorder"):
            # Kept from the last read that found one: the flush at exit may come after the process group is gone.
            self._collectives = read_flight_recorder(self._built_ns) or self._collectives
        if self._collectives is not None:
            facts["collectives"] = self._collectives.to_json()
        if last_flush is not None:
            facts["last_flush"] = last_flush.to_json()
        steps = self.recorder.steps.record()
        if steps is not None:
            facts["steps"] = steps.to_json()
        step_memory = self.recorder.memory.step.record()
        if step_memory is not None:
            facts["memory_step"] = step_memory.to_json()
        return facts


def _current_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for variable in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(variable)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{variable}={value!r} is not a rank (a whole number)") from None
    return 0


def _flush_at_exit(backend: ReportingBackend) -> None:
    """Flushes at interpreter exit, as early as Python allows: in threading's exit hook, which Python runs before it
    waits for the other threads and before the atexit hooks. concurrent.futures registers its own shutdown there
    when imported (imported below, so that ours, registered later, runs first: such hooks run in reverse order), and
    inductor's compile workers stop in an atexit hook: at our hook both still take work, so the triage can compile.
    Where another non-daemon thread still runs then (the training may be in it), the flush waits for the atexit hook,
    after those threads ended, where inductor cannot compile any more (`flusher.NOT_TRIAGING` says so in the dump).
    `threading._register_atexit` is CPython's private hook (3.9+), the one concurrent.futures itself uses; without
    it, the atexit hook flushes.

    A strong reference on purpose: users rarely keep the backend object themselves
    (`torch.compile(model, backend=ReportingBackend())`), and the records hold no activations."""
    import concurrent.futures.process  # noqa: F401  (their exit hooks registered before ours; see above)
    import concurrent.futures.thread  # noqa: F401

    flushed, waited_for = [], []

    def flush(early: bool) -> None:
        if flushed:
            return
        if early:
            waited_for.extend(_other_threads())
            if waited_for:
                return
        flushed.append(early)
        try:
            if early or not waited_for:
                backend._flush_now("the flush at exit")
            else:
                backend._flush_now("the flush at exit, late", threads=", ".join(waited_for))
        except Exception as e:  # at exit nothing can be raised to anyone; say what was lost
            log.warning("thunderfx_debug: the dump at exit failed: %s", e)

    register_early = getattr(threading, "_register_atexit", None)
    if register_early is not None:
        try:
            register_early(lambda: flush(early=True))
        except RuntimeError:  # the interpreter is already shutting down
            pass
    atexit.register(lambda: flush(early=False))


def _other_threads() -> list[str]:
    """The names of the non-daemon threads still running but this one and the workers of concurrent.futures' pools
    (inductor's compile threads among them), which their own exit hook stops after ours: threads that may be
    training. The pools' threads are read from concurrent.futures' registries of them (`_threads_queues`,
    `_threads_wakeups`: private, CPython 3.9+; without them every such thread counts)."""
    import concurrent.futures.process
    import concurrent.futures.thread

    pools = {*getattr(concurrent.futures.thread, "_threads_queues", {}),
             *getattr(concurrent.futures.process, "_threads_wakeups", {})}
    return [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon and t.is_alive() and t not in pools]
