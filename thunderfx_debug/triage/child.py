"""The flush-time triage's child: one Thunder split of the run (and, at `fusion`, its fusion regions) compiled again
as ThunderFX compiled it, and each piece timed against inductor (`judging`), in a process of its own.

    python -m thunderfx_debug.triage.child JOB_FOLDER [ATTEMPT]

The job is a folder the training process wrote (`jobs`). The child
1. compiles the split's FX module (Dynamo's, as it was: `graph_codec`) with `thunder.jit`, the run's options and
   executors (`thunder.rerun`), and calls it once on the piece's inputs (`piece_inputs.made_inputs`): its final
   traces must be the run's, line for line, or nothing of the job is timed (it would time other code than the run's);
2. measures what the split and `torch._inductor.compile` of the same FX module each hold in memory on one call
   (`judging.memory_of`), times the one against the other, then each region against torch.compile of its ops as
   torch calls;
3. writes, before each step, which piece and step it starts, and after each piece its record
   (`jobs.Results`), so that the parent knows where a child that died was, and a new child goes on with the pieces
   no child has started.
A process that dies does so here, not in the training process: its death is the piece's verdict (`triage.at_flush`).

Each piece's step is watched by faulthandler's watchdog thread (`faulthandler.dump_traceback_later`), which works
while the main thread is stuck in native code: past the piece's time limit it writes every thread's stack to the
log and ends the process, so that a hang is a verdict with where it hung.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.settings.config import TriageLevel
from thunderfx_debug.triage import graph_codec, jobs, judging
from thunderfx_debug.triage.judging import NotJudged, RunsAs, TrainingCall, because, no_grad_call
from thunderfx_debug.triage.piece_inputs import made_inputs
from thunderfx_debug.records import InputKind, Memory, Phase, Triage
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.recording import device_room
from thunderfx_debug.recording.check import kept_random_state
from thunderfx_debug.recording.piece_facts import split_facts
from thunderfx_debug.thunder import counterparts, rerun, torch_private
from thunderfx_debug.thunder.compile_events import SPANS
from thunderfx_debug.thunder.traces import fusion_regions

#: The steps that every piece of a job goes through first: a process that dies in one of them would die there again
#: for each piece, so the parent gives the pieces left that verdict instead of another child.
SHARED_STEPS = ("reading the job", "compiling the split with Thunder and calling it once")

#: How the verdict of a piece whose process ran out of device memory begins (`out_of_memory`).
OUT_OF_MEMORY = "not triaged: out of device memory"

#: What the watchdog writes first when it ends a piece's process (faulthandler's own words).
TIMEOUT_MARK = "Timeout ("


class _Split:
    """The job's split compiled in this process, with its inputs, kept for its regions (and, in a worker that runs
    several jobs, only for its own job). `against_the_run=False` (a compile ahead of the flush, on inputs made from
    the metadata: `run_ahead`) leaves the comparison with the run's traces to `given_the_run`."""

    def __init__(self, job: jobs.SplitJob, graph: bytes, tensors: dict[str, jobs.RunTensors],
                 against_the_run: bool = True):
        setup = job.setup
        self._made: tuple[list[Any], tuple] | None = None  # set by `release_inputs`
        self.module = graph_codec.decode(graph)
        self.compiled = rerun.jit_as_in_the_run(self.module, setup.options, setup.executors, setup.executor_modules,
                                                setup.prologue_pruning)
        self._bind(job, tensors)
        failed = None
        with on_the_device(job), kept_random_state(self.args), self.runs_as:
            try:
                self.call()
            except Exception as e:  # noqa: BLE001  (what Thunder built is compared first: see below)
                failed = e
        # Thunder keeps the traces it built before it runs them: whether the call failed or not, they say whether
        # this process compiled the run's code.
        if against_the_run:
            self._against_the_run(job)
        if failed is not None:
            raise NotJudged(because(
                "Thunder's compile of the split " + ("(the run's code, line for line) " if against_the_run else "")
                + f"failed on the triage's inputs ({self.inputs}; {_layouts_against(self.args, job.inputs.metas)})",
                failed)) from failed
        from thunderfx_debug.thunder.traces import final_traces

        fwd, bwd = final_traces(self.compiled)
        self.regions = {r.key: r for r in fusion_regions(fwd, Phase.FORWARD) + fusion_regions(bwd, Phase.BACKWARD)}

    def _bind(self, job: jobs.SplitJob, tensors: dict[str, jobs.RunTensors]) -> None:
        self.job, self.tensors = job, tensors
        self.args, self.inputs = made_inputs(job.inputs, tensors.get(job.key, jobs.RunTensors()))
        # The inputs the split writes into, as the run passed them: each call of either side starts from them.
        self.restore = [(self.args[i], self.args[i].detach().clone())
                        for i in split_facts(self.module).mutated_inputs
                        if i < len(self.args) and isinstance(self.args[i], torch.Tensor)]
        autocast = tuple((device, enabled, getattr(torch, dtype)) for device, enabled, dtype in job.autocast)
        self.runs_as = RunsAs(job.grad_enabled, autocast)
        self.call = TrainingCall(self.compiled, self.args, job.grad_outputs, self.restore)

    def _against_the_run(self, job: jobs.SplitJob) -> None:
        forward, backward = rerun.final_trace_texts(self.compiled)
        differs = rerun.same_trace(forward, job.fwd_text) or (
            rerun.same_trace(backward, job.bwd_text) and f"backward: {rerun.same_trace(backward, job.bwd_text)}")
        if differs and forward is not None:
            raise NotJudged("Thunder compiled other code for the split in a process of its own than in the run, so "
                            f"its time there is not the run's (the final traces differ at {differs}); a bug of "
                            "thunderfx_debug's inputs or options: report it with the dump")

    def release_inputs(self) -> None:
        """Lets go of the inputs made for the compile ahead, keeping what `given_the_run` compares them by (their
        non-tensor values, the metadata of each), and gives the allocator's cached memory back to the device: while it
        waits for the flush, a child ahead holds its CUDA context and what Thunder compiled, not a call's tensors."""
        from thunderfx_debug.recording.capture import value_meta

        self._made = ([None if isinstance(a, torch.Tensor) else a for a in self.args],
                      tuple(value_meta(a) for a in self.args))
        self.args = self.restore = self.call = None
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def given_the_run(self, job: jobs.SplitJob, tensors: dict[str, jobs.RunTensors]) -> str | None:
        """After `release_inputs`: the split compiled ahead, given the job the flush wrote (the run's tensors, its
        traces, the device lock): its inputs made again, from the run's tensors. None where that compile serves: the
        new inputs are laid out as the made ones (so Thunder runs the code it compiled for those) and its traces are
        the run's; else why not (the caller compiles the split again)."""
        before, made = self._made
        self._bind(job, tensors)
        tensor = [meta.kind is InputKind.TENSOR for meta in made]
        others = [i for i, (a, b) in enumerate(zip(before, self.args))
                  if tensor[i] != isinstance(b, torch.Tensor) or (not tensor[i] and type(a) is type(b) and a != b)]
        if others or len(before) != len(self.args):
            return f"the run's inputs differ from the ones it was compiled for (non-tensor inputs {others[:4]})"
        laid_out = _layouts_against(self.args, made)
        if laid_out != SAME_LAYOUTS:
            return f"the run's inputs are laid out otherwise than the ones it was compiled for ({laid_out})"
        try:
            self._against_the_run(job)
        except NotJudged as e:
            return str(e)
        return None


SAME_LAYOUTS = "every tensor laid out as the run's"


def _layouts_against(args, metas) -> str:
    """How the inputs made here differ from the run's in what compiled code sees of them (none, or the first few)."""
    from thunderfx_debug.recording.capture import value_meta

    fields = ("shape", "stride", "storage_offset", "dtype", "requires_grad")
    differ = []
    for i, (value, meta) in enumerate(zip(args, metas)):
        if not isinstance(value, torch.Tensor):
            continue
        made = value_meta(value)
        changed = [f"{f} {getattr(made, f)} against the run's {getattr(meta, f)}" for f in fields
                   if getattr(made, f) != getattr(meta, f)]
        if changed:
            differ.append(f"input {i}: " + ", ".join(changed))
    return "; ".join(differ[:4]) if differ else SAME_LAYOUTS


class on_the_device:
    """Holds the job's device lock (a file lock, `jobs.SplitJob.device_lock`) around work on the device, so that of
    the children that run at once none runs on the GPU while another times a piece: a piece timed while another
    child's kernels run would be timed with them. Timing takes the lock alone (`exclusive`); compiling and first
    calls (Thunder's compile at the split's first call, inductor's of a backward at its first) share it, so that the
    children compile side by side instead of one after another, and none of it overlaps a timing. Compiling without
    running (inductor's compile of a forward) needs no lock; the lock goes with a process that dies."""

    def __init__(self, job: jobs.SplitJob, exclusive: bool = False):
        self.path, self.exclusive = job.device_lock, exclusive

    def __enter__(self) -> None:
        self._file = None
        if self.path is not None:
            import fcntl

            self._file = open(self.path, "a")  # noqa: SIM115 (closed in __exit__)
            fcntl.flock(self._file, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)

    def __exit__(self, *exc: Any) -> None:
        if self._file is not None:
            self._file.close()  # and with it the lock


def _settings(job: jobs.SplitJob) -> judging.TriageSettings:
    return judging.TriageSettings(TriageLevel[job.level.upper()], job.deviation, job.looks, job.calls,
                                  job.piece_timeout_s)


def _split_verdict(split: _Split, step) -> Triage:
    job = split.job
    started = time.perf_counter()
    step("compiling the split with inductor")
    try:
        inductor = torch_private.inductor_compile(split.module, split.args)
    except Exception as e:
        raise NotJudged(because("inductor could not compile the split", e)) from e
    inductor_call = TrainingCall(inductor, split.args, job.grad_outputs, split.restore)
    with kept_random_state(split.args), split.runs_as:
        with on_the_device(job):
            judging.first_calls(split.call, inductor_call, split.compiled, list(split.regions.values()),
                                "the split", step)
            step("measuring what each side holds in memory")  # in this process's own allocator: shared is enough
            memory = {side: _memory(call) for side, call in (("thunder", split.call), ("inductor", inductor_call))}
        step("timing the split")
        compile_s = time.perf_counter() - started  # not the wait for the device below (another child's compile)
        with on_the_device(job, exclusive=True):
            triage = judging.judge(split.call, inductor_call, split.args, _settings(job),
                                   split.inputs, compile_s)
    return dataclasses.replace(triage, thunder_memory=memory["thunder"], inductor_memory=memory["inductor"])


def _memory(call: TrainingCall) -> Memory:
    """`judging.memory_of(call)`, or a record that says why it could not be measured (the timing goes on)."""
    try:
        return judging.memory_of(call)
    except Exception as e:  # noqa: BLE001  (a figure missing, said; not the piece's verdict)
        return Memory(note=f"not measured: {type(e).__name__}: {str(e).strip()[:300]}")


def _region_verdict(split: _Split, key: str, inputs: jobs.PieceInputs, step) -> Triage:
    job = split.job
    region = split.regions.get(key)
    if region is None:
        raise NotJudged(f"the split compiled in this process has no region {key}")
    step("making the region's inputs")
    try:
        args, kind = made_inputs(inputs, split.tensors.get(PieceKey(job.key).region(key), jobs.RunTensors()))
    except Exception as e:
        raise NotJudged(because("the triage could not make the inputs", e)) from e
    try:
        thunder = counterparts.region_callable(region)
    except LookupError as e:
        raise NotJudged(str(e)) from e
    started = time.perf_counter()
    step("compiling the region's ops with inductor")
    try:
        inductor = counterparts.inductor_region(region)
    except Exception as e:
        raise NotJudged(because("the region's ops could not be made torch calls for inductor", e)) from e
    thunder_call, inductor_call = no_grad_call(thunder, args), no_grad_call(inductor, args)
    with kept_random_state(args), RunsAs.inside_a_trace():
        with on_the_device(job):
            judging.first_calls(thunder_call, inductor_call, None, [region], "the region", step)
        step("timing the region")
        compile_s = time.perf_counter() - started
        with on_the_device(job, exclusive=True):
            return judging.judge(thunder_call, inductor_call, args, _settings(job), kind,
                                 compile_s)


#: folder -> the split compiled for it, in a worker process that runs a job's pieces one call after another.
_COMPILED: dict[str, _Split] = {}


def run(folder: Path, attempt: int = 0) -> None:
    """Judges the pieces of the job in `folder` that no child has started yet (see the module docstring)."""
    results = jobs.Results(folder)
    job = None
    try:
        job, graph, tensors = jobs.read(folder)
    except Exception as e:  # noqa: BLE001  (a job this child cannot read is every piece's verdict)
        results.step("*", SHARED_STEPS[0], attempt)
        results.done("*", Triage(error=because("the triage's child could not read its job", e)))
        return
    left = [piece for piece in job.pieces if not results.started(piece)]
    if not left:
        return
    SPANS.install()  # Dynamo's recompiles are how a region that compiled again shows (`counterparts`)
    faulthandler.enable(file=sys.stderr)
    split = _COMPILED.get(str(folder))
    if split is None:
        results.step(left[0], SHARED_STEPS[1], attempt)
        try:
            with _watched(job.piece_timeout_s):
                split = _Split(job, graph, tensors)
        except Exception as e:  # noqa: BLE001  (not judged, said whole)
            error = out_of_memory(e, "compiling the split and calling it once") or (
                str(e) if isinstance(e, NotJudged) else because(
                    "compiling the split with Thunder as the run did, or its first call, failed", e))
            for piece in left:
                results.done(piece, Triage(deviation=job.deviation, error=error))
            return
        _COMPILED.clear()
        _COMPILED[str(folder)] = split
    regions = dict(job.regions)
    for piece in left:

        def step(what: str, piece: str = piece) -> None:
            results.step(piece, what, attempt)

        step("starting")
        try:
            with _watched(job.piece_timeout_s):
                if piece == job.key:
                    triage = _split_verdict(split, step)
                else:
                    triage = _region_verdict(split, piece.rpartition("/")[2], regions[piece.rpartition("/")[2]],
                                             step)
        except Exception as e:  # noqa: BLE001  (anything a piece raises is its verdict, said whole)
            error = out_of_memory(e, (results.last_step(piece) or ("starting",))[0]) or (
                str(e) if isinstance(e, NotJudged) else because("the triage of this piece failed", e))
            triage = Triage(deviation=job.deviation, error=error)
        results.done(piece, triage)
        if not _device_usable():
            # An error a piece left on the device (a device-side assert) fails every later CUDA call of this
            # process: the next piece goes to a fresh one.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)


#: The pseudo-piece under which a child compiling ahead of the flush writes its step lines (no piece's: a child that
#: dies there has started none, and the flush's children take them all).
AHEAD = "(ahead of the flush)"
#: How much lower than the training's a child compiling ahead runs on the CPU (`os.nice`): it compiles while the
#: training runs, whose host thread feeds the device and must not wait for a core; at the flush the training waits,
#: and the niceness (which a process cannot take back) costs nothing unless the flush's children outnumber the cores.
AHEAD_NICENESS = 10
#: Seconds between two looks of a child compiling ahead for the flush's word (`jobs.GO`) and for its parent.
AHEAD_POLL_S = 0.2


def run_ahead(folder: Path, cap_bytes: int, training_pid: int) -> None:
    """A child started during training (`triage.ahead`): compiles the job's split with Thunder on inputs made
    from its metadata (the job holds none of the run's tensors yet) and calls it once, its allocator holding at most
    `cap_bytes` of device memory (0: no cap, for a split with no CUDA input), at a lower CPU priority than the
    training (`AHEAD_NICENESS`); then waits for the flush's word (`jobs.GO`), and goes
    on as any child (`run`) with the job the flush wrote, its compile done where it serves (`_Split.given_the_run`).
    A compile that fails here is not a verdict: the child compiles again on the run's inputs after the word. It ends,
    and removes its folder, when the training process (`training_pid`, its parent) is gone without a word."""
    go, results = folder / jobs.GO, jobs.Results(folder)
    ahead = None
    with contextlib.suppress(OSError):
        os.nice(AHEAD_NICENESS)
    if not go.exists():
        results.step(AHEAD, "compiling the split with Thunder ahead of the flush, on inputs made from its metadata", 0)
        try:
            job, graph, _ = jobs.read(folder)
            _cap_device_memory(cap_bytes or None)
            with _watched(job.piece_timeout_s):
                ahead = _Split(job, graph, {}, against_the_run=False)
            ahead.release_inputs()
            results.step(AHEAD, "compiled ahead; waiting for the flush", 0)
        except Exception as e:  # noqa: BLE001  (said in its step line; compiled again after the word)
            results.step(AHEAD, f"not compiled ahead ({type(e).__name__}: {str(e).strip()[:300]}); waiting for the "
                                "flush, which compiles it again", 0)
    while not go.exists():
        if os.getppid() != training_pid:  # its parent gone: this process was handed to another
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # the temporary folder made for it alone (`ahead`)
            return
        time.sleep(AHEAD_POLL_S)
    _cap_device_memory(None)  # the training waits for the flush now: the device's memory is the triage's to use
    if ahead is not None:
        job, _, tensors = jobs.read(folder)
        why_not = ahead.given_the_run(job, tensors)
        results.step(AHEAD, "the flush's word: the compile ahead serves" if why_not is None else
                     f"the flush's word: compiling again, {why_not[:300]}", 0)
        if why_not is None:
            _COMPILED.clear()
            _COMPILED[str(folder)] = ahead
    run(folder, 0)


def _cap_device_memory(cap_bytes: int | None) -> None:
    """At most `cap_bytes` of device memory for this process's allocator (None: no cap, and a process that has not
    touched the device yet does not start to: its CUDA context alone would take device memory)."""
    if not torch.cuda.is_available():
        return
    if cap_bytes is None:
        if torch.cuda.is_initialized():
            torch.cuda.set_per_process_memory_fraction(1.0)
        return
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, cap_bytes / total)))


def out_of_memory(error: BaseException, step: str) -> str | None:
    """The verdict of a piece whose process ran out of device memory during `step` (the error itself, or the one a
    `NotJudged` was raised from), with what the device had free then; None for any other error."""
    cause = error if device_room.is_out_of_memory(error) else error.__cause__
    if cause is None or not device_room.is_out_of_memory(cause):
        return None
    free = ""
    with contextlib.suppress(Exception):
        free_bytes, total = torch.cuda.mem_get_info()
        free = f"; the device had {free_bytes / 2**30:.1f} of its {total / 2**30:.1f} GiB free just after"
    return (f"{OUT_OF_MEMORY} in its process of its own while {step} ({device_room.out_of_memory_line(cause)})"
            f"{free}: the training, which holds its memory while it waits for the flush, was not touched; the "
            "flush at exit or backend.close(), after training, gives the children the training's unused cached memory")


def _device_usable() -> bool:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception as e:  # noqa: BLE001  (what the device says is printed; the process ends)
        print(f"the device is unusable after the piece: {type(e).__name__}: {e}", file=sys.stderr)
        return False


class _watched:
    """faulthandler's watchdog around a step: past `seconds`, every thread's stack to stderr and the process ends."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self) -> None:
        faulthandler.dump_traceback_later(self.seconds, exit=True, file=sys.stderr)

    def __exit__(self, *exc: Any) -> None:
        faulthandler.cancel_dump_traceback_later()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 4 and argv[1] == "--ahead":
        run_ahead(Path(argv[0]), int(argv[2]), int(argv[3]))
        return
    if not argv or len(argv) > 2:
        raise SystemExit("usage: python -m thunderfx_debug.triage.child JOB_FOLDER [ATTEMPT | --ahead CAP_BYTES "
                         "TRAINING_PID]")
    run(Path(argv[0]), int(argv[1]) if len(argv) > 1 else 0)


if __name__ == "__main__":
    main()
