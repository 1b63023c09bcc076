"""The triage's compiles ahead of the flush: children started during training that compile a Thunder split again,
so that the flush that triages it (which the training waits for) finds it compiled.

Why: a child is a fresh interpreter where the training process has initialised CUDA (`triage.at_flush`), and a fresh
interpreter compiles the split with Thunder again: nvFuser keeps the kernels it compiled in the process that
compiled them. On the H200's 4-layer Llama that second compile of the decoder split is 55-60 s of a 90 s flush.

How: a thread of the training process looks at the run's Thunder splits every `POLL_S`. Once a split has run
`READY_CALLS` times (its first backward done and the optimizer's state made, so that the run's device memory is
near what it keeps), the thread writes the split's job without the run's tensors (`at_flush._write_job` without
them: metadata only, nothing read from the device) and starts a child (`child.run_ahead`). The child compiles
the split with Thunder on inputs made from that metadata, calls it once, and waits. At the flush, the training
process (waiting now) writes the job again with the run's tensors, its traces and the flush's device lock, and gives
the word (`jobs.GO`); the child goes on as any child of the flush, its compile done, and `at_flush` waits for it as
for the others. Where the compile ahead does not serve (its inputs laid out otherwise than the run's, its traces
not the run's, a failure on the made inputs), the child compiles again after the word, as a child of the flush would.

Limits, and why they keep the training safe (docs/memory.md):
- A child starts only where the device has room for it (`recording.device_room.room`): its free memory less what the
  training process may take back without growing past its high-water mark, less THUNDERFX_DEBUG_DEVICE_MARGIN percent
  of the device (25 by default: a memory-tight run gets no child before the flush). Each child gets an equal part of
  that room: its CUDA context (`device_room.PROCESS_CONTEXT_BYTES`) and an allocator capped at the rest
  (`torch.cuda.set_per_process_memory_fraction`); where a part is below `device_room.MIN_CHILD_BYTES`, no child
  starts (`device_room.child_cap`). A child that runs out of its cap compiles again after the word, when the cap is
  lifted.
- While children ahead are alive, the thread reads the device every `POLL_S`: once the room is gone (the training
  grew past its high-water mark into the margin, or another process took the device's memory), every child ahead is
  ended at once, and their splits compile at the flush.
- At most `at_flush.workers(settings)` children ahead at once, the splits whose first call took longest first; the
  others compile at the flush. A child takes a CPU core while it compiles, at a lower priority than the training's
  (`child.AHEAD_NICENESS`), and runs its one call's kernels beside the training's; then it lets go of the inputs it
  made and holds its CUDA context and what Thunder compiled until the flush. Nothing is timed before the flush: a
  child timing on the GPU the training uses would time the training's kernels with its own.
- None outlives the flush after it: the flush hands each its job or ends it (`end_all`), and a child whose training
  process is gone ends and removes its folder; `backend.close()` and the exit's flush end those no flush was handed.
  A split compiled again in the run (new traces) is compiled at the flush, not ahead.
- Where the flush's children are forks (a process that has not initialised CUDA), nothing is compiled ahead: a fork
  starts with the training process's memory, and forking it mid-training would copy it mid-step.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from thunderfx_debug.children import pool
from thunderfx_debug.triage import jobs
from thunderfx_debug.records import SplitKind
from thunderfx_debug.recording import device_room
from thunderfx_debug.recording.recorder import GraphSnapshot, Recorder
from thunderfx_debug.records.keys import PieceKey

log = logging.getLogger("thunderfx_debug")

#: Seconds between two looks at the run's splits.
POLL_S = 1.0
#: Calls of a split before it is compiled ahead: the first backward done and the optimizer's state made.
READY_CALLS = 2


@dataclasses.dataclass
class AheadChild:
    """A child compiling one split ahead of the flush: the split's traces when it started (the flush hands it the
    split only while they are the same objects), its folder, process and output."""

    traces: tuple[Any, Any]
    folder: Path
    process: subprocess.Popen
    log: Path
    device: int | None = None  # the CUDA device index it compiles on (the split's inputs')


class Ahead:
    """Starts and keeps the children ahead of one run (see the module docstring).

    `slots()` says how many children compile ahead at once (0 while the flush's children would be forks);
    `write_job(folder, snapshot, split)` writes a split's job without the run's tensors; `done(key)` whether the
    triage has the split's verdicts already; `margin_percent` is THUNDERFX_DEBUG_DEVICE_MARGIN; `read(device)` reads
    a device's memory (`device_room.HighWater().read`; a test gives readings of its own)."""

    def __init__(self, recorder: Recorder, slots: Callable[[], int],
                 write_job: Callable[[Path, GraphSnapshot, Any], None], done: Callable[[str], bool],
                 margin_percent: float = 25.0, read: Callable[[int], device_room.DeviceReading] | None = None):
        self._recorder, self._slots, self._write_job, self._done = recorder, slots, write_job, done
        self._margin = margin_percent
        self._read = read if read is not None else device_room.HighWater().read
        self._children: dict[str, AheadChild] = {}
        self._tried: set[str] = set()  # split keys compiled ahead, or that could not be: each once
        # The thread's looks and a flush's reading of the records and hand-over, one at a time (reentrant: the flush
        # holds it around both).
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._watch, name="thunderfx_debug triage ahead", daemon=True)
        self._thread.start()
        # At exit, after the exit's flush (threading's exit hook, which runs before atexit's): the children no flush
        # was handed end, with their folders. A weak reference: a backend dropped earlier is not kept alive.
        atexit.register(_close_at_exit, weakref.ref(self))

    def __getstate__(self) -> dict[str, Any]:
        # A copy of the backend (Lightning deep-copies it) compiles nothing ahead: the original does.
        return {"_recorder": None, "_slots": None, "_write_job": None, "_done": None, "_children": {},
                "_tried": set(), "_pid": -1, "_margin": self._margin, "_read": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock(), _stop=threading.Event(), _thread=None)

    # ---- the thread -----------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            if os.getpid() != self._pid:
                return
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._start_ready()
                except Exception as e:  # noqa: BLE001  (said once; the flush compiles every split as before)
                    log.warning("thunderfx_debug: compiling the triage's splits ahead of the flush failed, and stops "
                                "(the flush compiles them): %s: %s", type(e).__name__, e)
                    return

    def _start_ready(self) -> None:
        self._end_without_room()
        slots = self._slots() - len(self._children)
        if slots <= 0:
            return
        ready = []
        for state in list(self._recorder.graphs):
            for split in list(state.splits):
                key = PieceKey.of(state.name, split.name)
                if (split.split.kind is SplitKind.THUNDER and key not in self._tried and split.error is None
                        and split.calls >= READY_CALLS and split.captured is not None and not self._done(key)):
                    first = split.first
                    took = 0.0 if first is None else sum(first.forward.samples_ms) + sum(first.backward.samples_ms)
                    ready.append((took, key, state, split))
        for _, key, state, split in sorted(ready, key=lambda r: -r[0])[:slots]:
            device = _device_of(split)
            if device is None:  # no device memory to keep for the training (a CPU run made to use fresh children)
                self._tried.add(key)
                self._start(key, state, split, 0)
                continue
            reading = self._read(device)
            cap = device_room.child_cap(reading, self._margin, self._slots() - len(self._children))
            if not cap:
                self._once("triage ahead: no room", "thunderfx_debug: the triage's children compile at the flush, not during "
                           "training: the device has %.1f GiB free beyond the training's high-water mark, and %.0f %% "
                           "of it (%.1f GiB, THUNDERFX_DEBUG_DEVICE_MARGIN) stays free for the training",
                           reading.beyond_the_training / 2**30, self._margin, reading.total * self._margin / 1e2 / 2**30)
                return  # not tried: room may come (the training's high-water mark does not fall, other processes end)
            self._tried.add(key)
            self._start(key, state, split, cap)

    def _end_without_room(self) -> None:
        """Ends every child ahead once the device's room is gone (see the module docstring)."""
        devices = {device for child in self._children.values() if (device := child.device) is not None}
        for device in devices:
            reading = self._read(device)
            if not device_room.no_room(reading, self._margin):
                continue
            self._once("triage ahead: ended", "thunderfx_debug: the triage's children compiling ahead of the flush were ended: the "
                       "device has %.1f GiB free beyond the training's high-water mark, less than THUNDERFX_DEBUG_DEVICE"
                       "_MARGIN's %.0f %%; their splits compile at the flush", reading.beyond_the_training / 2**30,
                       self._margin)
            for key, child in list(self._children.items()):
                if child.device == device:
                    self.discard(self._children.pop(key))

    def _once(self, what: str, message: str, *args: Any) -> None:
        self._recorder.failures.note_once(what, message, *args, level=logging.INFO)

    def _start(self, key: str, state, split, cap_bytes: int) -> None:
        snapshot = self._recorder.one_split(state, split)
        split_snapshot = snapshot.splits[0]
        if split_snapshot.fwd_trace is None:
            return
        folder = Path(tempfile.mkdtemp(prefix="thunderfx_debug_ahead_")) / f"ahead_{key.replace('/', '_')}"
        try:
            self._write_job(folder, snapshot, split_snapshot)
        except Exception as e:  # noqa: BLE001  (the flush says why, as it writes the same job)
            log.debug("thunderfx_debug: %s not compiled ahead: %s", key, e)
            shutil.rmtree(folder.parent, ignore_errors=True)
            return
        log_path = folder / "ahead.log"
        process = pool.start_process(
            [sys.executable, "-m", "thunderfx_debug.triage.child", str(folder), "--ahead", str(cap_bytes),
             str(os.getpid())],
            log_path, pool.this_module_path())
        self._children[key] = AheadChild((split_snapshot.fwd_trace, split_snapshot.bwd_trace), folder,
                                         process, log_path, _device_of(split))

    # ---- the flush ------------------------------------------------------------------------------------------------
    def __enter__(self) -> Ahead:
        """The flush holds the thread still while it reads the records (which the thread reads too) and hands splits
        over: no child starts meanwhile."""
        self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def child_for(self, key: str, traces: tuple[Any, Any]) -> AheadChild | None:
        """The child compiling `key` ahead, where it is alive and compiled the split as it is now (the same trace
        objects); it is the flush's from here on. A child that is not is ended, and its split compiles at the flush."""
        child = self._children.pop(key, None)
        if child is None:
            return None
        if child.process.poll() is None and child.traces[0] is traces[0] and child.traces[1] is traces[1]:
            return child
        self.discard(child)
        return None

    @staticmethod
    def go(child: AheadChild) -> None:
        """The flush's word: the job in the child's folder is complete."""
        (child.folder / jobs.GO).touch()

    @staticmethod
    def discard(child: AheadChild) -> None:
        """Ends `child` (where it runs) and removes its folder."""
        if child.process.poll() is None:
            pool.end_process(child.process, timeout_s=0)  # ended at once, with what it started
        shutil.rmtree(child.folder.parent, ignore_errors=True)

    def end_all(self) -> None:
        """Ends every child no flush was handed: none outlives the flush that calls this."""
        with self._lock:
            for child in list(self._children.values()):
                self.discard(child)
            self._children.clear()

    def close(self) -> None:
        """Stops the thread and ends every child not handed to a flush."""
        self._stop.set()
        self.end_all()

    @property
    def children(self) -> Mapping[str, AheadChild]:
        return dict(self._children)


def _device_of(split) -> int | None:
    """The CUDA device index of a split's first CUDA input (its children compile there), None where it has none."""
    for meta in split.captured.observed:
        device = getattr(meta, "device", None) or ""
        if device.startswith("cuda"):
            return int(device.partition(":")[2] or 0)
    return None


def _close_at_exit(ahead: weakref.ref) -> None:
    alive = ahead()
    if alive is not None and os.getpid() == alive._pid:
        alive.close()
