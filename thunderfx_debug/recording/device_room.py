"""How much of the device's memory the tool may take while training runs, and telling an out-of-memory error apart.

A training run tuned to its device runs close to the device's memory; whatever the tool holds there while training
runs is memory a later step may need (a longer batch, an evaluation pass, a checkpoint's staging copy), and an
out-of-memory error in the training ends the run. So (docs/memory.md):

- Nothing of the tool's that outlives a call holds device memory during training: what the correctness sentinel keeps
  between the parts of a checked call lives on the host, and its work runs in a memory pool of its own that is given
  back to the device when each part ends (`recording.isolation`).
- A process of the tool's that uses the device during training (the triage's children compiling splits ahead of the
  flush, `triage.ahead`) starts only where `room` says the device has space for it beyond the training's own
  high-water mark (`torch.cuda.max_memory_reserved`, which a user's `reset_peak_memory_stats` can lower: the
  highest reading seen is kept) plus THUNDERFX_DEBUG_DEVICE_MARGIN percent of the device, and is ended as soon as
  that space is gone.

Example (figures in GiB for reading; the functions take bytes):
    >>> GiB = 2**30
    >>> reading = DeviceReading(total=80 * GiB, free=30 * GiB, reserved=40 * GiB, peak_reserved=48 * GiB)
    >>> reading.beyond_the_training / GiB  # free, less what the training reserved at its highest and gave back
    22.0
    >>> room(reading, margin_percent=25) / GiB  # less 25 % of the device
    2.0
    >>> room(reading, margin_percent=30)
    0
    >>> child_cap(reading, margin_percent=10, children=2) / GiB  # 14 GiB of room: 7 a child, its context aside
    6.0
    >>> child_cap(reading, margin_percent=26, children=1)  # 1.2 GiB: below the least a child is started with
    0
"""

from __future__ import annotations

import dataclasses
import threading

import torch

#: Device memory a fresh process takes before it allocates anything: its CUDA context with torch, Thunder and
#: nvFuser loaded (600-800 MiB measured on an H100, docs/memory.md), rounded up.
PROCESS_CONTEXT_BYTES = 1 << 30
#: The least device memory a process of the tool's is started with during training, its context and its allocator
#: together: a split's compile and one call on inputs of the run's size rarely fit in less.
MIN_CHILD_BYTES = PROCESS_CONTEXT_BYTES + (1 << 30)


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """One device's memory, in bytes: its `total`, what is `free` on it (every process counted), and what this
    process's caching allocator has `reserved` now and at its highest (`peak_reserved`)."""

    total: int
    free: int
    reserved: int
    peak_reserved: int

    @property
    def beyond_the_training(self) -> int:
        """The free memory less what the training may take back without growing past its high-water mark."""
        return self.free - max(0, self.peak_reserved - self.reserved)


class HighWater:
    """The highest `torch.cuda.max_memory_reserved` seen per device: the training's own reading may be reset
    (`torch.cuda.reset_peak_memory_stats`), its high-water mark for the tool's purpose may not."""

    def __init__(self):
        self._seen: dict[int, int] = {}
        self._lock = threading.Lock()

    def read(self, device: int) -> DeviceReading:
        """The device's reading now (no device synchronisation: `cudaMemGetInfo` and the allocator's counters)."""
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        with self._lock:
            peak = max(self._seen.get(device, 0), torch.cuda.max_memory_reserved(device), reserved)
            self._seen[device] = peak
        return DeviceReading(total, free, reserved, peak)


def room(reading: DeviceReading, margin_percent: float) -> int:
    """Bytes the tool may take on the device beyond the training's high-water mark and the margin (0: none)."""
    return max(0, int(reading.beyond_the_training - reading.total * margin_percent / 100))


def child_cap(reading: DeviceReading, margin_percent: float, children: int) -> int:
    """The allocator cap (bytes) of each of `children` processes started now, the room shared equally and each one's
    context set aside; 0 where a share is below `MIN_CHILD_BYTES` (none is started)."""
    share = room(reading, margin_percent) // max(1, children)
    return share - PROCESS_CONTEXT_BYTES if share >= MIN_CHILD_BYTES else 0


def no_room(reading: DeviceReading, margin_percent: float) -> bool:
    """Whether the training's side of the device has grown into the margin: processes of the tool's end then."""
    return reading.beyond_the_training < reading.total * margin_percent / 100


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says the device ran out of memory: torch's allocator (`torch.OutOfMemoryError`), or a
    library's own allocation failing (a CUDA error, cuBLAS, nvFuser) with "out of memory" in its message."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "cuda_error_out_of_memory" in text
                                                or "cublas_status_alloc_failed" in text)


def out_of_memory_line(error: BaseException) -> str:
    """The first line of an out-of-memory error's message: what it tried to allocate and what the device had."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"
