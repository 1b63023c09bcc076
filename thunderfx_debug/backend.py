"""The torch.compile entry point: ThunderFX with a report of what it did."""

from __future__ import annotations

import atexit
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from thunder.dynamo import ThunderCompiler

from thunderfx_debug import compat, thunder_adapter
from thunderfx_debug.config import Config, ConfigError, Inputs, OnError, OWN_OPTIONS, Timing, load_config
from thunderfx_debug.recorder import GraphState, Recorder, describe_exception
from thunderfx_debug.records import Report
from thunderfx_debug.runner import GraphRunner, SplitRunner
from thunderfx_debug.timing import CudaClock, DeviceHold, Sampling, clock_for

log = logging.getLogger("thunderfx_debug")


class ReportingBackend(ThunderCompiler):
    """A drop-in `torch.compile` backend: compiles every Dynamo graph with ThunderFX exactly as
    `thunder.dynamo.ThunderCompiler` does, and records how ThunderFX split it, what it fused and what it costs.

    Args:
        dump_dir: where `flush()` writes the dump (`<dump_dir>/rank<R>/...`); THUNDERFX_DEBUG_DIR wins over it.
            Without either, nothing is written and `report()` is the way to read the records.
        **options: thunderfx_debug's own settings by their lower-case names (`repro`, `inputs`, `inputs_max_mb`,
            `timing`, `timing_every`, `timing_warmup`, `ranks`, `on_error`, `strict`, `nvtx`; see
            `thunderfx_debug.config`, the environment variables win), and everything else goes to Thunder as
            ThunderCompiler's options do (`executors=...`, `transforms=...`).

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
        _current_rank()  # a malformed RANK / LOCAL_RANK fails here, before training, not at the first compile
        super().__init__(**options)
        self.recorder = Recorder(self.config, dict(self.thunder_options))
        self._rank: int | None = None
        self._world_size: int | None = None
        self._flushes = 0
        if self.config.dump_dir is not None:
            from thunderfx_debug.dump import check_writable

            check_writable(self.config.dump_dir)
            _flush_at_exit(self)

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
        return self.config.records_rank(self.rank)

    # ---- compile ------------------------------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, sample_args: list[Any]):
        dynamic = thunder_adapter.has_dynamic_inputs(sample_args)
        inductor_compile = compat.make_inductor_compile(dynamic)
        if not self.recording:
            split_gm, _ = thunder_adapter.compile_graph(self, gm, sample_args, inductor_compile)
            return split_gm
        devices = {str(x.device) for x in sample_args if isinstance(x, torch.Tensor)}
        state = self.recorder.new_graph(gm, sample_args, clock_for(devices))
        with self.recorder.failures.guard(f"counting the compiles of the frame of {state.name}"):
            self._warn_on_recompiles(state)
        started = time.perf_counter()
        try:
            split_gm, info = thunder_adapter.compile_graph(self, gm, sample_args, inductor_compile)
        except Exception as e:
            return self._on_graph_error(state, e, sample_args)
        self.recorder.graph_compiled(state, info, split_gm, time.perf_counter() - started)
        timing = self.config.timing
        sampling = Sampling(self.config.timing_every, self.config.timing_warmup, enabled=timing >= Timing.GRAPH)
        hold = self._device_hold(state)
        with self.recorder.failures.guard(f"wrapping the splits of {state.name}"):
            for split in state.splits:
                wrapped = SplitRunner(split.piece.compiled, split, state, sampling, timed=timing >= Timing.SPLIT,
                                      hold=hold)
                if self.config.inputs is Inputs.REAL:
                    wrapped.first_call = self._on_first_split_call
                setattr(split_gm, split.name, wrapped)
            if timing >= Timing.FUSION or self.config.nvtx:  # NVTX ranges also work without fusion timing
                self._instrument_fusions(state, sampling)
        return GraphRunner(self, state, split_gm, sampling, timed=timing >= Timing.GRAPH, hold=hold)

    def _device_hold(self, state: GraphState) -> DeviceHold | None:
        """Fusion-level timing on CUDA holds the device back on sampled calls, so that region marks time kernels rather
        than waits for the host's launches (see `timing.DeviceHold`); coarser timing measures the call as it runs."""
        if self.config.timing < Timing.FUSION or not isinstance(state.clock, CudaClock):
            return None
        with self.recorder.failures.guard(f"preparing the fusion timing of {state.name}"):
            return DeviceHold.for_current_cuda_device()
        return None

    def _instrument_fusions(self, state: GraphState, sampling: Sampling) -> None:
        from thunderfx_debug import fusion_timing

        fusion_timing.instrument_graph(
            state, sampling, nvtx=self.config.nvtx, time_regions=self.config.timing >= Timing.FUSION
        )

    def _warn_on_recompiles(self, state: GraphState) -> None:
        compile_id = state.facts.get("compile_id") or ""
        frame = compile_id.split("/")[0]
        if not frame:
            return
        if any(g.facts.get("compile_id") == compile_id for g in self.recorder.graphs if g is not state):
            return  # another graph of the same compile (DDP's optimizer hands one graph per bucket)
        self.recorder.frame_compiles[frame] += 1
        if self.recorder.frame_compiles[frame] == self.config.recompile_warn_threshold + 1:
            where = f" ({state.facts['frame']})" if state.facts.get("frame") else ""
            message = (
                f"Dynamo frame {frame}{where} was compiled {self.recorder.frame_compiles[frame]} times, more than "
                f"THUNDERFX_DEBUG_RECOMPILE_WARN={self.config.recompile_warn_threshold} (last reason: "
                f"{state.facts.get('recompile_reason') or 'not recorded'}); each compile runs ThunderFX again."
            )
            self.recorder.warnings.append(message)
            log.warning("thunderfx_debug: %s", message)

    # ---- training-path callbacks ------------------------------------------------------------------------------------
    def _on_first_call(self, state: GraphState, args) -> None:
        if self.config.inputs is not Inputs.REAL:
            return
        with self.recorder.failures.guard(f"capturing the real inputs of {state.name}"):
            from thunderfx_debug.repro import inputs as repro_inputs

            repro_inputs.capture(state, args, self.config.inputs_max_mb)

    def _on_first_output(self, state: GraphState, outputs) -> None:
        if self.config.inputs is not Inputs.REAL:
            return
        with self.recorder.failures.guard(f"capturing the first outputs of {state.name}"):
            from thunderfx_debug.repro import inputs as repro_inputs

            repro_inputs.capture_outputs(state, outputs)

    def _on_first_split_call(self, split, args, inner):
        """Runs a split's first call, keeping host copies of its inputs and outputs (THUNDERFX_DEBUG_INPUTS=real)."""
        from thunderfx_debug.repro import inputs as repro_inputs

        with self.recorder.failures.guard(f"capturing the real inputs of {split.name}"):
            repro_inputs.capture_split(split, args, self.config.inputs_max_mb)
        out = inner(*args)
        with self.recorder.failures.guard(f"capturing the first outputs of {split.name}"):
            repro_inputs.capture_split_outputs(split, out)
        return out

    def _on_graph_error(self, state: GraphState, error: BaseException, args):
        """A graph failed to compile or run with Thunder: record it, write its repro, then re-raise or fall back."""
        self.recorder.graph_failed(state, error, state.failed_piece)
        if state.real_inputs is None:  # failed to compile: the inputs Dynamo handed the backend are the real ones
            self._on_first_call(state, args)
        state.fallback = self.config.on_error is OnError.FALLBACK  # before the flush, so that the dump says so
        if self.config.dump_dir is not None:
            with self.recorder.failures.guard(f"writing the failure report of {state.name}"):
                self.flush()
        if self.config.on_error is not OnError.FALLBACK:
            raise error
        state.fallback = True
        log.warning(
            "thunderfx_debug: %s failed under Thunder (%s: %s); THUNDERFX_DEBUG_ON_ERROR=fallback runs it with "
            "inductor from now on",
            state.name,
            type(error).__name__,
            str(error)[:200],
        )
        try:
            return torch._inductor.compile(state.gm, list(args))
        except Exception as inductor_error:
            log.warning("thunderfx_debug: inductor failed on %s too (%s); running it eagerly", state.name, inductor_error)
            state.error += "\n\nThe inductor fallback failed as well:\n" + describe_exception(inductor_error)
            return state.gm

    # ---- report -------------------------------------------------------------------------------------------------
    def report(self) -> Report:
        """The records so far (traces and fusions read now from what Thunder built). Does not synchronise the
        device: timing samples whose events are not complete yet are left for later."""
        snapshots = self.recorder.snapshot(wait=False)
        return self.recorder.build_report(snapshots, files={}, meta=self._meta())

    def flush(self) -> Path | None:
        """Writes the dump to `<dump_dir>/rank<R>/` atomically and returns that directory (None without a dump
        dir, or on a rank that does not record). Waits for outstanding timing events."""
        if self.config.dump_dir is None or not self.recording:
            return None
        from thunderfx_debug.dump import write_dump

        self._flushes += 1
        with self.recorder.failures.guard("writing the dump"):
            return write_dump(self)
        return None

    def _meta(self) -> dict[str, Any]:
        from thunderfx_debug.manifest import run_meta

        meta: dict[str, Any] = {"rank": self.rank}
        with self.recorder.failures.guard("collecting the run's versions, settings and environment"):
            meta = run_meta(self)
        return meta


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
    """Flushes at interpreter exit. A strong reference on purpose: users rarely keep the backend object themselves
    (`torch.compile(model, backend=ReportingBackend())`), and the records hold no activations."""

    def flush():
        try:
            backend.flush()
        except Exception as e:  # at exit nothing can be raised to anyone; say what was lost
            log.warning("thunderfx_debug: the dump at exit failed: %s", e)

    atexit.register(flush)
