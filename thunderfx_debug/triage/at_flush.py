"""The flush-time triage (THUNDERFX_DEBUG_TRIAGE): each Thunder split, and at `fusion` each of its fusion regions,
timed against the same piece compiled by inductor, in processes of their own.

The training process only writes, per split, what a child needs (`jobs`: the split's FX module as Dynamo built it,
Thunder's options and executors by name, the inputs' metadata, host copies of the run's own tensors still alive,
the run's final traces) and reads back what the children wrote. Each child (running `child`) compiles the split again
as ThunderFX did, checks that its final traces are the run's line for line, and times the pieces. Nothing a child
does can reach the training process: not its memory, not its CUDA context, not its random streams. A child that
dies (a signal, a native abort, a device-side assert, an illegal memory access, an out-of-memory) or hangs past
THUNDERFX_DEBUG_TRIAGE_TIMEOUT gives the piece it was in that verdict, with what it printed last; the pieces of the
split it had not started go on in a fresh child, and the next split too.

Where the children run: a process that has not initialised CUDA forks them from itself, one at a time (they have
every executor the run registered, a custom one of the training script's too; `children.forks`); a process
that has cannot fork a child that uses CUDA, so its children are fresh interpreters, long-lived workers that take one
split after another (`children.pool`, the workers of `verify` and `bench`), several at once so that their compiles
overlap: they compile and make first calls side by side and time one at a time, nothing else on the device
meanwhile (`child.on_the_device`); there an executor of the user's is there when the
module that registers it on import can be imported (`jobs.executor_modules`); a piece whose executor is missing
there is not judged, and says which executor and why.

Where the children are fresh interpreters, each split is compiled ahead of the flush, during training, by a child
the flush then hands the run's tensors (`ahead`): a fresh process compiles the split with Thunder again, which
is most of a flush's time otherwise.

The training process waits while the children run, at every flush that triages (the periodic one included): a child
timing pieces on the GPU the training still used would time the training's kernels with its own. The children's
CUDA contexts and the inputs they are handed (host copies of the split's live tensors, written to a temporary
folder) cost device memory and disk only while the flush runs.

Each piece's time is set beside the run's own sampled time of the same piece where the run has one on the same clock
(THUNDERFX_DEBUG_TIMING=split or fusion), when the report is built (`artifacts.report_builder`, with every figure of
the run: its steps, its headline samples): the time lost per step is computed from the run's time and the ratio, and
a piece whose time in its child differs from the run's by more than THUNDERFX_DEBUG_DEVIATION says so.

Results are kept per split while its final traces stay the same objects, so a later flush of the same run times
nothing again; a flush that cannot time (SIGTERM's) marks the pieces not timed yet with why, and a later one times them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.settings.config import TriageLevel
from thunderfx_debug.children import pool
from thunderfx_debug.children.forks import can_fork, forked, run_function
from thunderfx_debug.children.protocol import how_it_ended
from thunderfx_debug.triage import graph_codec, jobs
from thunderfx_debug.triage.ahead import Ahead, AheadChild
from thunderfx_debug.triage.child import OUT_OF_MEMORY, SHARED_STEPS, TIMEOUT_MARK
from thunderfx_debug.triage.judging import TriageSettings
from thunderfx_debug.triage.piece_inputs import run_tensors
from thunderfx_debug.render.headline import summed_headline
from thunderfx_debug.render.progress import announce
from thunderfx_debug.render.text import about_seconds
from thunderfx_debug.records import InputMeta, SplitKind, Triage
from thunderfx_debug.recording.recorder import GraphSnapshot, Recorder, SplitSnapshot
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import rerun

log = logging.getLogger("thunderfx_debug")

#: owner key ("graph0/thunder_0", "graph0/thunder_0/nvFusion0_forward") -> its triage
TriageIndex = Mapping[str, Triage]

#: The flushes after which the training process trains no more (`occasion` of `Triager.triage`).
TRAINING_OVER = ("the flush at exit", "backend.close()")
#: Lines of a dead child's output kept in the piece's verdict; of a hung one's, from its watchdog's first line.
TAIL_LINES, WATCHDOG_LINES = 25, 200
#: Children per split at most: a child that dies takes one piece with it; a split has its regions after it.
MAX_ATTEMPTS = 64
#: What a fresh worker takes to start and import torch and Thunder, in the triage's announced estimate (a fork starts
#: at once). About 4 s on a 2-core CPU machine; more where nvFuser and CUDA load too.
WORKER_START_S = 10.0


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one child of a job ended: `status` its exit status (negative: killed by that signal; None: killed past its
    time limit), its output's `log`."""

    number: int
    status: int | None
    log: Path
    note: str = ""


class Triager:
    """The triage of one run's pieces, kept while each split's final traces stay the same objects."""

    def __init__(self):
        # split key -> (its trace objects, kept alive so that their ids stay theirs; the owner -> triage of the split
        # and its regions)
        self._done: dict[str, tuple[tuple, dict[str, Triage]]] = {}
        self.ahead: Ahead | None = None
        self.spent_s = 0.0  # the wall time of every triage so far (what the log and triage.md say it took)
        self.announced_s: float | None = None  # what the last triage that timed pieces said beforehand it would take

    def compile_ahead(self, recorder: Recorder, settings: TriageSettings,
                      thunder_options: Callable[[], Mapping[str, Any]]) -> None:
        """Compiles the run's splits in children ahead of the flush, during training, where the flush's children
        are fresh interpreters (`ahead`)."""
        if settings.level is TriageLevel.OFF or self.ahead is not None:
            return

        def write_job(folder: Path, snapshot: GraphSnapshot, split: SplitSnapshot) -> None:
            _write_job(folder, PieceKey.of(snapshot.state.name, split.state.name), snapshot, split, settings,
                       thunder_options(), run_tensors_too=False)

        self.ahead = Ahead(recorder, lambda: 0 if forks(settings) else workers(settings), write_job,
                                        lambda key: key in self._done, settings.device_margin)

    def holding_still(self) -> contextlib.AbstractContextManager:
        """Within it, no split is read or compiled ahead of the flush: the flush reads the records that the thread
        that compiles ahead reads too (`ahead`)."""
        return self.ahead if self.ahead is not None else contextlib.nullcontext()

    def known(self) -> dict[str, Triage]:
        """owner -> triage of the pieces triaged so far."""
        return {owner: t for _, results in self._done.values() for owner, t in results.items()}

    def triage(self, snapshots: Sequence[GraphSnapshot], settings: TriageSettings, failures: ReportingFailures,
               thunder_options: Mapping[str, Any], occasion: str = "the flush",
               unable: str | None = None) -> dict[str, Triage]:
        """owner -> triage of every thunder split (and at `fusion` region) of `snapshots` that ran: the pieces not
        triaged yet are timed now (`occasion` names the flush in what it says on stderr), or where this flush cannot
        time (`unable` says why) they carry that reason, and a later flush that can times them."""
        if settings.level is TriageLevel.OFF:
            return {}
        try:
            return self._triage(snapshots, settings, failures, thunder_options, occasion, unable)
        finally:
            if self.ahead is not None:
                self.ahead.end_all()  # none of the children started before this flush outlives it

    def _triage(self, snapshots: Sequence[GraphSnapshot], settings: TriageSettings, failures: ReportingFailures,
                thunder_options: Mapping[str, Any], occasion: str, unable: str | None) -> dict[str, Triage]:
        pending, untimed = [], {}
        for snapshot in snapshots:
            for split in snapshot.splits:
                if split.state.split.kind is not SplitKind.THUNDER:
                    continue
                key = PieceKey.of(snapshot.state.name, split.state.name)
                if split.state.error or split.fwd_trace is None:  # said, so that no page counts it as judged
                    failure = snapshot.state.failure
                    why = ("Thunder failed on it in the run" if split.state.error else
                           f"it never ran: {snapshot.state.name}/{failure.split or ''} raised before it".rstrip("/")
                           if split.state.calls == 0 and failure is not None else
                           "it has not run yet" if split.state.calls == 0 else "its traces could not be read")
                    untimed[key] = Triage(deviation=settings.deviation, error=f"not triaged: {why}")
                    continue
                done = self._done.get(key)
                if done is None or done[0][0] is not split.fwd_trace or done[0][1] is not split.bwd_trace:
                    unseen = _regions_not_seen(split, settings)
                    if unseen and occasion == "the periodic flush":
                        # What a region's trace says of its inputs is not all the run's compiled code guards on
                        # (a saved activation that requires grad in the run is a plain tensor in the backward
                        # trace): timed on that, the region compiles again in the child and is not judged. A
                        # periodic flush leaves such a split to a later one; the others time it as it is.
                        untimed.update({owner: Triage(deviation=settings.deviation, error=(
                            f"not triaged yet: no call of {', '.join(unseen[:3])} was observed so far; a later flush "
                            "times the split and its regions")) for owner in _owners(key, split, settings)})
                        continue
                    pending.append((key, snapshot, split))
        if not pending:
            return {**untimed, **self.known()}
        if unable is not None:
            return {**untimed, **self.known(), **{owner: Triage(deviation=settings.deviation, error=unable)
                                       for key, _, split in pending
                                       for owner in _owners(key, split, settings)}}
        regions = sum(len(split.regions) for _, _, split in pending) if settings.level >= TriageLevel.FUSION else 0
        estimate = self.announced_s = _estimate_s([(snapshot, split) for _, snapshot, split in pending], settings)
        compiled_ahead = len(set(self.ahead.children) & {key for key, *_ in pending}) if self.ahead else 0
        announce(f"thunderfx_debug: {occasion} times {_count(len(pending), 'Thunder split')}"
                 + (f" and {_count(regions, 'fusion region')}" if regions else "")
                 + f" against inductor in processes of their own (THUNDERFX_DEBUG_TRIAGE={settings.level.name.lower()})"
                 + (f"; {compiled_ahead} of them compiled (or compiling) ahead of it, during training"
                    if compiled_ahead else "")
                 + (f", {about_seconds(estimate)} (from the run's first calls, compiles included, and its time per "
                    "call; the summary says what it took)" if estimate is not None else "")
                 + ("; training waits meanwhile" if occasion == "the periodic flush" else ""))
        started = time.perf_counter()
        if occasion in TRAINING_OVER and torch.cuda.is_available() and torch.cuda.is_initialized():
            # The training has ended: its allocator's cached, unused blocks go back to the device for the children.
            # Not at a flush during training, whose steps would then allocate their memory afresh, elsewhere.
            torch.cuda.empty_cache()
        with tempfile.TemporaryDirectory(prefix="thunderfx_debug_triage_") as root:
            folders: dict[str, Path] = {}
            found: dict[str, dict[str, Triage]] = {}
            unusable = _device_unusable()  # else the run's tensors are copied below, its captured copies complete
            if unusable:
                log.warning("thunderfx_debug: the training process's device cannot be waited for (%s): the triage's "
                            "children make every input from the recorded metadata", unusable)
            lock = None if forks(settings) else str(Path(root) / "device.lock")
            ahead: dict[str, AheadChild] = {}  # split key -> its child, compiled ahead of this flush
            with self.holding_still():  # no child starts ahead while this flush runs its own
                for index, (key, snapshot, split) in enumerate(pending):
                    child = self.ahead.child_for(key, (split.fwd_trace, split.bwd_trace)) if self.ahead else None
                    folder = Path(root) / f"split{index}" if child is None else child.folder
                    try:
                        _write_job(folder, key, snapshot, split, settings, thunder_options,
                                   run_tensors_too=unusable is None, device_lock=lock)
                        folders[key] = folder
                        if child is not None:
                            Ahead.go(child)
                            ahead[key] = child
                    except Exception as e:  # noqa: BLE001  (a job that cannot be written: its pieces say why)
                        if child is not None:
                            Ahead.discard(child)
                        error = f"the triage could not hand the split to a process of its own: {type(e).__name__}: {e}"
                        found[key] = {owner: Triage(deviation=settings.deviation, error=error)
                                      for owner in _owners(key, split, settings)}
                attempts: dict[Path, list[Attempt]] = {}
                try:
                    attempts = run_children([f for k, f in folders.items() if k not in ahead], settings, Path(root))
                    if ahead:
                        launcher = _launcher(Path(root))
                        attempts.update({child.folder: _finish_ahead(child, settings, launcher)
                                         for child in ahead.values()})
                    if len(folders) > 1 and workers(settings) > 1:
                        attempts.update(_again_alone(list(folders.values()), settings, Path(root)))
                except Exception as e:  # noqa: BLE001  (no child could be run: every piece says why, none is lost)
                    failures.record("running the triage's children", e)
                    attempts = {folder: [Attempt(0, None, folder / "attempt0.log",
                                                 f"no child could be run: {type(e).__name__}: {e}")]
                                for folder in folders.values()}
                for key, folder in folders.items():
                    with failures.guard(f"reading the triage of {key}"):
                        found[key] = verdicts(folder, attempts.get(folder, []))
                for child in ahead.values():
                    Ahead.discard(child)
        for key, _, split in pending:
            self._done[key] = ((split.fwd_trace, split.bwd_trace), found.get(key, {}))
        triaged = [t for key, *_ in pending for t in self._done[key][1].values()]
        took = time.perf_counter() - started
        self.spent_s += took
        log.info("thunderfx_debug: the triage took %.1f s (%d pieces: %d judged, %d deviate, %d not judged)",
                 took, len(triaged), sum(t.error is None for t in triaged),
                 sum(t.deviates for t in triaged), sum(t.error is not None for t in triaged))
        return {**untimed, **self.known()}


def _regions_not_seen(split: SplitSnapshot, settings: TriageSettings) -> list[str]:
    """The regions of `split` that the triage would time (at `fusion`) but whose inputs no call has shown yet."""
    if settings.level < TriageLevel.FUSION:
        return []
    return [region.key for region in split.regions if region.key not in split.region_input_meta]


def _owners(key: PieceKey, split: SplitSnapshot, settings: TriageSettings) -> list[str]:
    regions = [r.key for r in split.regions] if settings.level >= TriageLevel.FUSION else []
    return [key, *(key.region(region) for region in regions)]


# ---- the jobs -------------------------------------------------------------------------------------------------------
def _device_unusable() -> str | None:
    """None once the training process's device has done its work; else what it said (an error of the training's own
    left its CUDA context unusable: nothing can be copied off it)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001  (said in each piece's verdict)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _write_job(folder: Path, key: PieceKey, snapshot: GraphSnapshot, split: SplitSnapshot, settings: TriageSettings,
               thunder_options: Mapping[str, Any], run_tensors_too: bool = True,
               device_lock: str | None = None) -> None:
    """The job of one split (see `jobs`); without `run_tensors_too` (a device that cannot be read), metadata only.
    Raises where the split cannot be handed over: a Thunder option or transform that is an object, a graph that
    does not pickle."""
    compiled = split.state.split.compiled
    options, others = jobs.literal_options(thunder_options)
    others += [f"transforms ({name})" for name in rerun.other_transforms(compiled)]
    if others:
        raise ValueError(f"the run's Thunder options {', '.join(others)} are objects, which a process of its own "
                         "cannot be given")
    executors = rerun.executor_objects(dict(thunder_options))
    names = None if thunder_options.get("executors") is None else tuple(e.name for e in executors)
    setup = jobs.ThunderSetup(options, names, jobs.executor_modules(executors), rerun.prologue_pruning(compiled))
    captured = split.state.captured
    metas = repro_inputs.split_metas(snapshot, split)
    def handed(captured_call, piece_metas) -> jobs.RunTensors:
        return run_tensors(captured_call, piece_metas) if run_tensors_too else jobs.RunTensors()

    tensors = {key: handed(captured, metas)}
    regions = []
    if settings.level >= TriageLevel.FUSION:
        for region in split.regions:
            region_metas = repro_inputs.region_metas(split, region)
            regions.append((region.key, jobs.PieceInputs(region_metas, region.inputs)))
            tensors[key.region(region.key)] = handed(split.region_captures.get(region.key), region_metas)
    job = jobs.SplitJob(
        key=key, setup=setup, inputs=jobs.PieceInputs(metas, tuple(split.state.split.input_names)),
        grad_enabled=captured.grad_enabled if captured is not None else True,
        autocast=tuple((d, e, str(t).removeprefix("torch.")) for d, e, t in (captured.autocast if captured else ())),
        grad_outputs=_grad_outputs(captured), regions=tuple(regions), fwd_text=split.fwd_text,
        bwd_text=split.bwd_text, level=settings.level.name.lower(), deviation=settings.deviation,
        looks=tuple(settings.looks), calls=settings.calls,
        piece_timeout_s=settings.timeout_s, device_lock=device_lock)
    jobs.write(folder, job, graph_codec.encode(split.state.split.original_module), tensors)


def _grad_outputs(captured) -> tuple[InputMeta | None, ...] | None:
    if captured is None or captured.grad_outputs is None:
        return None
    return tuple(captured.grad_outputs)


# ---- the children ---------------------------------------------------------------------------------------------------
def forks(settings: TriageSettings) -> bool:
    """Whether the children are forks of this process (see the module docstring)."""
    if settings.processes != "auto":
        return settings.processes == "fork"
    return can_fork()


def workers(settings: TriageSettings) -> int:
    """How many children compile side by side: forks run one at a time; fresh workers a quarter of the cores, at
    most 4 (each compile takes a core, and their device memory adds up), unless the settings say."""
    if forks(settings):
        return 1
    return settings.workers or min(4, max(1, (os.cpu_count() or 1) // 4))


def run_children(folders: Sequence[Path], settings: TriageSettings, root: Path) -> dict[Path, list[Attempt]]:
    """Runs the jobs in `folders`, one child at a time, until each job's pieces are all started or a child died in a
    step that every piece needs (`child.SHARED_STEPS`); the attempts of each job."""
    attempts: dict[Path, list[Attempt]] = {folder: [] for folder in folders}
    if not folders:
        return attempts
    if forks(settings):
        for folder in folders:
            _go_on(folder, attempts[folder], lambda attempt, log: _forked(folder, attempt, log, settings), settings)
        return attempts
    launcher, env = _launcher(root)

    def alone(job: pool.Job, env: Mapping[str, str], worker_end: pool.Finished) -> pool.Finished:
        folder = Path(job.args[0])
        tried = attempts[folder]
        tried.append(Attempt(0, worker_end.status, job.log, worker_end.note))
        _go_on(folder, tried, lambda attempt, log: _fresh(launcher, folder, attempt, log, env, settings), settings)
        last = tried[-1]
        return pool.Finished(job, last.status, 0.0, "alone", last.note)

    def timeout(folder: Path) -> float:
        job, _, _ = jobs.read(folder)
        return settings.timeout_s * (len(job.pieces) + 1)  # the child's own watchdog ends a piece before this

    finished = pool.run_jobs(
        [pool.Job(launcher, (str(folder), "0"), folder / "attempt0.log") for folder in folders],
        slots=[env] * min(workers(settings), len(folders)), timeout_s=max(timeout(f) for f in folders), run_alone=alone,
        allow_package=True)
    for result in finished:
        folder = Path(result.job.args[0])
        if result.how == "worker":
            attempts[folder].append(Attempt(0, result.status, result.job.log))
        elif result.how in ("timeout", "not_run"):
            attempts[folder].append(Attempt(0, None, result.job.log, result.note))
            _go_on(folder, attempts[folder],
                   lambda attempt, log, folder=folder: _fresh(launcher, folder, attempt, log, env, settings), settings)
    return attempts


def _again_alone(folders: Sequence[Path], settings: TriageSettings, root: Path) -> dict[Path, list[Attempt]]:
    """The jobs some of whose pieces ran out of device memory while other children shared the device, run again one
    child at a time (their attempts); a piece that runs out alone keeps that verdict."""
    short = {}
    for folder in folders:
        job, _, _ = jobs.read(folder)
        pieces = [piece for piece, t in jobs.Results(folder).records().items()
                  if t.error and t.error.startswith(OUT_OF_MEMORY)]
        if pieces:
            jobs.Results(folder).retry(job.pieces if job.key in pieces else pieces)
            short[folder] = pieces
    if not short:
        return {}
    log.info("thunderfx_debug: %s ran out of device memory beside other children of the triage; again, one at a time",
             _count(sum(len(p) for p in short.values()), "piece"))
    return run_children(list(short), dataclasses.replace(settings, workers=1), root)


def _launcher(root: Path) -> tuple[Path, dict[str, str]]:
    """The script a fresh child runs, written into `root`, and its environment (this process's module path)."""
    launcher = root / "triage_child.py"
    launcher.write_text("from thunderfx_debug.triage.child import main\nmain()\n")
    return launcher, pool.this_module_path()


def _finish_ahead(child: AheadChild, settings: TriageSettings,
                  launcher: tuple[Path, dict[str, str]]) -> list[Attempt]:
    """Waits for a child that compiled its split ahead of this flush and was given the word; the pieces it did not
    start go on in fresh children (`launcher`: `_launcher`'s), as any job's."""
    job, _, _ = jobs.read(child.folder)
    limit = settings.timeout_s * (len(job.pieces) + 1)  # its own watchdog ends a piece before this
    status = pool.end_process(child.process, limit)
    tried = [Attempt(0, status, child.log, "" if status is not None else f"killed after {limit:.0f} s")]
    launcher, env = launcher
    _go_on(child.folder, tried, lambda attempt, log: _fresh(launcher, child.folder, attempt, log, env, settings),
           settings)
    return tried


def _go_on(folder: Path, tried: list[Attempt], start, settings: TriageSettings) -> None:
    """Starts children for the job in `folder` (`start(attempt, log)` -> Attempt) while it has pieces no child has
    started and the last child did not die in a step every piece needs."""
    job, _, _ = jobs.read(folder)
    while len(tried) < MAX_ATTEMPTS and jobs.pieces_left(job, folder):
        if tried and _died_in_shared_step(job, folder):
            return
        number = len(tried)
        tried.append(start(number, folder / f"attempt{number}.log"))
        if tried[-1].status == 0 and not jobs.pieces_left(job, folder):
            return


def _died_in_shared_step(job: jobs.SplitJob, folder: Path) -> bool:
    results = jobs.Results(folder)
    records = results.records()
    for piece in job.pieces:
        step = results.last_step(piece)
        if step is not None and piece not in records and step[0] in SHARED_STEPS:
            return True
    return False


def _forked(folder: Path, attempt: int, log: Path, settings: TriageSettings) -> Attempt:
    """A child forked from this process runs the job (`forks.run_function`: its output into `log`, Dynamo
    and inductor as a fresh process has them, one intra-op thread)."""
    job, _, _ = jobs.read(folder)
    limit = settings.timeout_s * (len(jobs.pieces_left(job, folder)) + 1)
    status = forked(run_function, ("thunderfx_debug.triage.child:run", str(log), [folder, attempt]), limit)
    return Attempt(attempt, status, log, "" if status is not None else f"killed after {limit:.0f} s")


def _fresh(launcher: Path, folder: Path, attempt: int, log: Path, env: Mapping[str, str],
           settings: TriageSettings) -> Attempt:
    job, _, _ = jobs.read(folder)
    limit = settings.timeout_s * (len(jobs.pieces_left(job, folder)) + 1)
    status = pool.run_process([sys.executable, str(launcher), str(folder), str(attempt)], log, env, limit)
    return Attempt(attempt, status, log, "" if status is not None else f"killed after {limit:.0f} s")


# ---- what the children found ----------------------------------------------------------------------------------------
def verdicts(folder: Path, tried: Sequence[Attempt]) -> dict[str, Triage]:
    """owner -> triage of every piece of the job in `folder`: what its children wrote, and for a piece a child died
    in, that death (how, in which step, the child's last lines)."""
    job, _, _ = jobs.read(folder)
    results = jobs.Results(folder)
    records = results.records()
    if "*" in records:  # the child could not read the job
        return {piece: records["*"] for piece in job.pieces}
    found: dict[str, Triage] = {}
    shared_death = None
    for piece in job.pieces:
        if piece in records:
            found[piece] = records[piece]
            continue
        step = results.last_step(piece)
        if step is None:  # no child started it
            note = next((a.note for a in reversed(tried) if a.note), "")
            error = (f"not judged: {shared_death}" if shared_death else f"not judged: {note}" if note else
                     "not judged: no process was left to time it (the split's children died one after another)")
            found[piece] = Triage(deviation=job.deviation, error=error)
            continue
        what, number = step
        attempt = next((a for a in tried if a.number == number), None)
        error = _death(piece, what, attempt, job.piece_timeout_s)
        if what in SHARED_STEPS:
            shared_death = f"the process that compiled its split died while {what} (see {job.key}'s verdict)"
        found[piece] = Triage(deviation=job.deviation, error=error, died=True)
    return found


def _death(piece: str, step: str, attempt: Attempt | None, timeout_s: float) -> str:
    """A piece's verdict where the process that timed it died: how, where, and its last lines (past its time limit,
    the watchdog's stacks of every thread, where it hung)."""
    lines: list[str] = []
    if attempt is not None and attempt.log.exists():
        lines = attempt.log.read_text(errors="replace").rstrip().splitlines()
    ended = next((i for i, line in enumerate(lines) if line.startswith(TIMEOUT_MARK)), None)
    tail = "\n".join(lines[ended:ended + WATCHDOG_LINES] if ended is not None else lines[-TAIL_LINES:])
    if attempt is None:
        how = "died"
    elif attempt.status is None or ended is not None:
        how = f"did not finish within {timeout_s:.0f} s (THUNDERFX_DEBUG_TRIAGE_TIMEOUT) and was ended"
    else:
        how = how_it_ended(attempt.status) + (f" ({attempt.note})" if attempt.note and attempt.status >= 0 else "")
    return (f"the process that timed it {how} during {step}: a crash of the piece, not of the training, which went on"
            f" (the piece's repro scripts rerun it alone)\n{tail}")


# ---- what the flush says --------------------------------------------------------------------------------------------
def _estimate_s(pending: Sequence[tuple[GraphSnapshot, SplitSnapshot]], settings: TriageSettings) -> float | None:
    """About how many seconds the triage of the `pending` splits takes, from the run's own figures: each split's
    compiles (Thunder compiling it again and inductor compiling it, each about as long as Thunder's first call of it
    took in the run; regions about as long again), `workers` of them side by side (greedy: at most their sum over
    the workers plus the longest), fresh workers' start (`WORKER_START_S`), and the rounds of the first look of both
    sides at the piece's time per call in the run, one piece at a time. That time is the headline median of its
    sampled calls (`render.headline`: the first and the disturbed ones left out; a median over raw samples of a
    rarely sampled piece can be one that compiled, seconds where the piece takes a millisecond). None where the run
    timed no first call."""
    compiles, timing = [], 0.0
    calls = 2 * (settings.looks[0] * settings.calls + 2)
    for snapshot, split in pending:
        first = split.state.first
        if first is not None and first.forward.samples_ms:
            factor = 3 if settings.level >= TriageLevel.FUSION and split.regions else 2
            compiles.append(factor * (sum(first.forward.samples_ms) + sum(first.backward.samples_ms)) / 1e3)
        left_out = {d.call for d in snapshot.state.waits.disturbed()}
        run = summed_headline([split.state.forward.timing(), split.state.backward.timing()], left_out)
        if run is not None and not run.fallback:  # nothing but the first or disturbed calls: no time per call known
            timing += calls * run.median_ms / 1e3
    if not compiles:
        return None
    side_by_side = min(workers(settings), len(pending))
    start = 0.0 if forks(settings) else WORKER_START_S
    return start + sum(compiles) / side_by_side + (1 - 1 / side_by_side) * max(compiles) + timing


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def deviating(triage: TriageIndex) -> dict[str, str]:
    """owner -> why its scripts are written even with THUNDERFX_DEBUG_REPRO=none ("slower_than_inductor",
    "faster_than_inductor", "triage_died": a piece whose triage took its process down, rerun alone by its scripts)."""
    return {owner: t.why for owner, t in triage.items() if t.why is not None}


def announce_cost(settings: TriageSettings) -> None:
    """Says once, when the backend is made, what the triage will cost at flush: a cost said before it is paid."""
    if settings.level is TriageLevel.OFF:
        return
    announce(f"thunderfx_debug: THUNDERFX_DEBUG_TRIAGE={settings.level.name.lower()}: the first flush that triages "
             "(backend.flush(), the one at exit, the first periodic one, which training waits for) compiles each "
             "Thunder split again in a process of its own and times it against inductor"
             + (", each of its fusion regions too" if settings.level >= TriageLevel.FUSION else "")
             + ": up to two or three times what the splits' first calls take in this run, often far less; "
             "THUNDERFX_DEBUG_TRIAGE=off skips it")
