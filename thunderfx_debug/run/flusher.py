"""Writing one backend's dump, during training and at its end.

`DumpFlusher.flush()` writes the dump in the calling thread and returns when it is on disk (an explicit
`backend.flush()`, interpreter exit, SIGTERM, a graph that failed). `flush_in_background()` is the periodic flush
(THUNDERFX_DEBUG_FLUSH_EVERY), called from the training path: the training thread does only what must read the
recorder and Thunder (resolve the timing samples whose events are complete, without waiting for the device; read
the traces and make the scripts of graphs that are new or changed, both cached; build the records), then hands the
finished, immutable records to a writer thread, which serialises them (graph.json, summary.txt, trace.json,
manifest.json) and writes the files that changed. The writer thread touches neither CUDA nor Thunder nor the
recorder. One flush at a time: a periodic flush that finds the previous one still writing is skipped, and a
flush in the calling thread waits for it. A forked child of the training process (a DataLoader worker inherits the
backend) writes nothing.

With THUNDERFX_DEBUG_TRIAGE, a flush first times the pieces not triaged yet against inductor (`triage.at_flush`, in
processes of its own while the training thread waits): the explicit one, the one at exit, the periodic one (once
per piece: the later ones find nothing new). The dump at SIGTERM does not (`NOT_TRIAGING` says why, in the dump, for each piece not timed yet), nor a
flush at exit that Python runs too late for inductor to compile.

Every write is atomic and the manifest comes last (`dump.DumpWriter`), so a process killed at any moment leaves the
last complete dump readable. Before the first write into `rank<R>/`, an earlier run's dump found there is moved to
`runs/<its run id>/rank<R>/` (`dump.move_earlier_run_aside`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from thunderfx_debug.records import layout
from thunderfx_debug.artifacts.artifact import Artifact, ArtifactSettings
from thunderfx_debug.artifacts.dump_contents import ArtifactCache, file_index, report_files
from thunderfx_debug.artifacts.report_builder import FlushFindings, build_report
from thunderfx_debug.dump.files import DumpWriter, move_earlier_run_aside
from thunderfx_debug.minimize.at_flush import MinimizeSettings, Minimizer
from thunderfx_debug.records import FlushCost, FlushPart, FlushStage, GraphRecord
from thunderfx_debug.recording.recorder import Recorder
from thunderfx_debug.render.report import Report
from thunderfx_debug.triage.judging import TriageSettings
from thunderfx_debug.triage.at_flush import Triager, deviating

log = logging.getLogger("thunderfx_debug")

#: The occasions of a flush that does not time pieces against inductor, and what the pieces not timed yet say instead.
NOT_TRIAGING = {
    "the dump at SIGTERM": "not triaged: the dump at SIGTERM times nothing (the job is ending, often within a grace "
                           "period, and the device may be what hangs); a flush before it times the pieces (the "
                           "periodic one, backend.flush(), or the one at exit)",
    "the flush at exit, late": "not triaged: the flush at interpreter exit ran after Python had stopped its threads' "
                               "work (other threads were still running when the main thread ended: {threads}), where "
                               "inductor can no longer compile; call backend.flush() at the end of training",
}


@dataclasses.dataclass(frozen=True)
class FlushStats:
    """What one flush cost. `training_thread_ms`: the time the calling (training) thread spent in it;
    `writer_ms`: serialising and writing, in the writer thread for a periodic flush (else within the former)."""

    kind: str  # "periodic" or "now"
    training_thread_ms: float
    writer_ms: float
    files_written: int
    files_unchanged: int
    started_s: float = 0.0  # time.monotonic() when it started (which steps it overlapped; not in the manifest)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "started_s"}


@dataclasses.dataclass
class _Prepared:
    rank_dir: Path
    writer: DumpWriter
    report: Report
    artifacts: list[Artifact]


class DumpFlusher:
    """Writes the dump of one backend's `recorder` into `<dump_dir>/rank<R>/` (see the module docstring).

    Args:
        dump_dir: THUNDERFX_DEBUG_DIR, read at each flush (as the backend's config has it then).
        recorder: the backend's records.
        settings: which artifacts to make, read at each flush.
        rank: the rank now (it is known for sure only once torch.distributed is initialised).
        meta: the run's facts for the manifest, given the number of this flush and the costs of the last one.
        process_uid: this process's id in the manifests (`runs.RunIdentity`), to tell its own dump from an earlier
            run's.
        on_report: called with the graphs' records of each flush, in the training thread (TORCH_TRACE's emitter).
    """

    def __init__(self, dump_dir: Callable[[], Path], recorder: Recorder, settings: Callable[[], ArtifactSettings],
                 rank: Callable[[], int], meta: Callable[[int, FlushStats | None], dict[str, Any]], process_uid: str,
                 on_report: Callable[[tuple[GraphRecord, ...]], None] | None = None,
                 triage: TriageSettings | None = None, minimize: MinimizeSettings | None = None):
        self._dump_dir, self.recorder, self._settings = dump_dir, recorder, settings
        self._on_report = on_report
        self._rank, self._meta, self._process_uid = rank, meta, process_uid
        self.failures = recorder.failures
        self.flushes = 0
        self.history: collections.deque[FlushStats] = collections.deque(maxlen=256)
        self._cache = ArtifactCache()
        self._triage_settings = triage or TriageSettings()
        self._triager = Triager()
        self._triager.compile_ahead(recorder, self._triage_settings, lambda: self._settings().thunder_options)
        self._minimizer = Minimizer(minimize)
        self._writers: dict[Path, DumpWriter] = {}
        self._lock = threading.Lock()  # one flush at a time; a periodic one hands it to its writer thread
        self._holder: int | None = None  # the thread in a flush's first half, while it holds the lock
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        self._deferred: list[Callable[[], None]] = []
        # A forked child (a DataLoader worker) inherits the backend, its SIGTERM handler and its atexit flush, with
        # a copy of the records as they were at the fork: it must not write them over its parent's dump.
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        # A copy (Lightning deep-copies the arguments of torch.compile, the backend with them) gets a lock of its own
        # and no writer thread.
        state = dict(self.__dict__)
        for name in ("_lock", "_writer", "_writer_error", "_holder"):
            state.pop(name)
        state["_deferred"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _writer=None, _writer_error=None, _holder=None)

    # ---- entry points ---------------------------------------------------------------------------------------------
    def flush(self, wait_for_device: bool = True, occasion: str = "the flush", **why: str) -> Path | None:
        """Writes the dump now, in this thread (waiting for a periodic flush still writing), and returns its rank
        directory (None when it could not be written: a reporting failure, logged). `wait_for_device=False` leaves
        out the timing samples whose CUDA events are not complete (at SIGTERM, where the device may hang).
        `occasion` names the flush (what the triage says it times; `NOT_TRIAGING` lists those that time nothing, and
        `why` fills in the blanks of what they say)."""
        if not self.in_its_process:
            return None
        rank_dir = None
        with self._flushing():
            started, started_s = time.perf_counter(), time.monotonic()
            with self.failures.guard("writing the dump"):
                prepared = self._prepare(wait_for_device, occasion, why)
                written, unchanged = prepared.writer.write(report_files(prepared.report, prepared.artifacts,
                                                                        self.failures))
                elapsed_ms = (time.perf_counter() - started) * 1e3
                self.history.append(FlushStats("now", elapsed_ms, elapsed_ms, written, unchanged, started_s))
                rank_dir = prepared.rank_dir
        self._raise_writer_error()
        self._run_deferred()
        return rank_dir

    def flush_in_background(self) -> bool:
        """The periodic flush: the records are built in this thread, serialised and written in a writer thread.
        Returns False (and does nothing) when the previous flush is still being written."""
        self._raise_writer_error()
        if not self.in_its_process:
            return True
        if not self._lock.acquire(blocking=False):
            return False
        self._holder = threading.get_ident()
        handed_over = False
        try:
            started, started_s = time.perf_counter(), time.monotonic()
            prepared = None
            with self.failures.guard("writing the dump"):
                prepared = self._prepare(wait_for_device=False, occasion="the periodic flush")
            if prepared is None:
                return True  # a failure, logged; the next period tries again
            pause_ms = (time.perf_counter() - started) * 1e3
            writer = threading.Thread(target=self._write_and_release, args=(prepared, pause_ms, started_s),
                                      name="thunderfx_debug dump writer", daemon=True)
            self._holder = None
            self._writer = writer
            writer.start()  # from here on the writer thread holds the lock and releases it
            handed_over = True
            return True
        finally:
            if not handed_over:
                self._holder = None
                self._lock.release()
            self._run_deferred()

    def stop_compiling_ahead(self) -> None:
        """Ends the children that compile splits ahead of a flush (`triage.ahead`) and their thread."""
        if self._triager.ahead is not None:
            self._triager.ahead.close()

    @property
    def triaged(self) -> dict[str, Any]:
        """owner -> the flush-time triage of the pieces triaged so far (see `thunderfx_debug.triage.at_flush`)."""
        return self._triager.known()

    @property
    def minimized(self) -> dict[str, Any]:
        """owner -> the flush-time reduction of the flagged pieces minimized so far (see `thunderfx_debug.minimize`)."""
        return self._minimizer.reductions

    @property
    def in_its_process(self) -> bool:
        """False in a forked child of the process that built it (which writes nothing)."""
        return os.getpid() == self._pid

    def after_flush(self, action: Callable[[], None]) -> None:
        """Runs `action` now or, when this thread is inside a flush (a signal handler interrupted it), as soon as
        that flush is done: a flush is never entered twice by one thread."""
        if self._holder == threading.get_ident():
            self._deferred.append(action)
        else:
            action()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for a periodic flush still being written; False if it is still writing after `timeout` seconds."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
            return not writer.is_alive()
        return True

    # ---- the two halves -------------------------------------------------------------------------------------------
    def _prepare(self, wait_for_device: bool, occasion: str, why: dict[str, str] | None = None) -> _Prepared:
        """The training thread's half: records and artifacts, no serialisation; first, the pieces not triaged yet
        are timed against inductor (see `thunderfx_debug.triage.at_flush`), but on the occasions of `NOT_TRIAGING`."""
        rank, dump_dir = self._rank(), self._dump_dir()
        rank_dir = dump_dir / layout.rank_dir_name(rank)
        self.flushes += 1
        writer = self._writers.get(rank_dir)
        if writer is None:
            moved = move_earlier_run_aside(dump_dir, rank, self._process_uid)  # before our first write there
            if moved is not None:
                log.info("thunderfx_debug: the earlier run's dump in %s moved to %s", rank_dir, moved)
            writer = self._writers[rank_dir] = DumpWriter(rank_dir)
        parts: list[FlushPart] = []
        clock = time.perf_counter()

        def part(stage: FlushStage, announced_s: float | None = None, seconds: float | None = None) -> None:
            nonlocal clock
            now = time.perf_counter()
            parts.append(FlushPart(stage, now - clock if seconds is None else seconds, announced_s))
            clock = now

        with self._triager.holding_still():  # its thread, which compiles splits ahead of the flush, reads them too
            snapshots = self.recorder.snapshot(wait=wait_for_device)
            part(FlushStage.READING)
            triaged = self._triager.known()
            spent = self._triager.spent_s
            with self.failures.guard("triaging the pieces against inductor"):
                unable = NOT_TRIAGING.get(occasion)
                triaged = self._triager.triage(snapshots, self._triage_settings, self.failures,
                                               self._settings().thunder_options, occasion,
                                               unable.format(**(why or {})) if unable is not None else None)
            if self._triager.spent_s > spent:  # it timed pieces: the figure its log line says, said again
                part(FlushStage.TRIAGE, self._triager.announced_s, self._triager.spent_s - spent)
            clock = time.perf_counter()
        artifacts = self._cache.artifacts(snapshots, self._settings(), self.failures, show_progress=rank == 0,
                                          deviating=deviating(triaged))
        part(FlushStage.SCRIPTS)
        if wait_for_device and occasion not in NOT_TRIAGING:  # not at periodic flushes, SIGTERM's, nor too late
            with self.failures.guard("minimizing the pieces the correctness sentinel flagged"):
                minimized = len(self._minimizer.reductions)
                self._minimizer.minimize(snapshots, self._settings(), self.failures)
                if len(self._minimizer.reductions) > minimized:
                    part(FlushStage.MINIMIZE, self._minimizer.announced_s)
        artifacts = artifacts + self._minimizer.artifacts()
        last = self.history[-1] if self.history else None
        meta = self._meta(self.flushes, last)
        report = build_report(snapshots, file_index(artifacts), meta, self.failures,
                              FlushFindings(triaged, self._minimizer.reductions))
        part(FlushStage.RECORDS)
        cost = FlushCost(occasion, tuple(p for p in parts if p.seconds >= 0.0005 or p.announced_s is not None),
                         self._triager.spent_s or None)
        report = dataclasses.replace(report, meta={**report.meta, "flush": cost.to_json()})
        if self._on_report is not None:
            with self.failures.guard("writing the TORCH_TRACE artifacts"):
                self._on_report(report.graphs)
        return _Prepared(rank_dir, writer, report, artifacts)

    def _write_and_release(self, prepared: _Prepared, pause_ms: float, started_s: float) -> None:
        """The writer thread's half of a periodic flush (`pause_ms`: what the first half cost the training thread)."""
        try:
            started = time.perf_counter()
            with self.failures.guard("writing the dump"):
                files = report_files(prepared.report, prepared.artifacts, self.failures)
                written, unchanged = prepared.writer.write(files)
                self.history.append(FlushStats("periodic", pause_ms, (time.perf_counter() - started) * 1e3,
                                               written, unchanged, started_s))
        except BaseException as e:  # strict mode re-raised it: the training thread raises it at its next flush
            self._writer_error = e
        finally:
            self._lock.release()

    # ---- helpers --------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _flushing(self) -> Iterator[None]:
        self._lock.acquire()  # waits for a periodic flush's writer
        self._holder = threading.get_ident()
        try:
            yield
        finally:
            self._holder = None
            self._lock.release()

    def _raise_writer_error(self) -> None:
        error, self._writer_error = self._writer_error, None
        if error is not None:
            raise error

    def _run_deferred(self) -> None:
        while self._deferred and self._holder is None:
            self._deferred.pop(0)()
