"""Where the correctness sentinel's work runs, so that a checked call leaves the training exactly as an unchecked one
would: the same random numbers, the same memory layout, the same library state.

On CUDA, everything a check allocates and runs (copies of inputs and outputs, eager and float64 references, the
comparisons) goes into its own memory pool (`torch.cuda.MemPool`) on its own stream, per device:
- The pool: the run's caching allocator never hands the check a block the training freed, nor the training a block
  the check freed, so the training's tensors land where they would without the check. That matters beyond neatness:
  a kernel that writes out of bounds (the H200's nvFuser does, past an `iota` output) corrupts whatever lies next to
  its output, and with another layout it would corrupt something else. Each entry point enters the isolation in the
  thread that does the work: the forward check on the training thread, the backward check's hooks on whichever
  thread the engine runs them (on CUDA a per-device thread, or the training thread for a node with no CUDA input,
  such as Thunder's `ThunderFunction`, whose input is a meta tensor). While entered, every allocation made on the
  check's stream goes to the pool, from whichever thread makes it (`thunder.torch_private.allocating_to`,
  as CUDA graph capture routes a stream's allocations): the eager backward of a check runs some of its nodes on
  autograd's device thread, on the check's stream. Where torch lacks that, `torch.cuda.use_mem_pool` routes the
  entering thread's allocations only.
- The stream: cuBLAS keeps a workspace per (handle, stream), allocated on first use; on the training's stream the
  check's first matmul would allocate the training's workspace (in the check's pool), so that the training then
  allocates nothing where it otherwise would. On a stream of its own the check has its own workspace.
- Ordering: the check's stream waits for the training's before the check reads anything, and the host waits for the
  check's stream before handing control back, so that no kernel of the check still reads a tensor of the run that the
  run may free and reuse after the check returned (no `record_stream` either: it would delay the reuse of the run's
  own blocks, and so change their layout).
The CPU and CUDA random states are saved and restored around every entry (`check.kept_random_state`).

What stays shared: library state that a first use initialises outside the caching allocator (cuBLAS handles, lazily
loaded kernel modules), which changes no result; the device's free memory (a check needs room of its own); and, while
a check is entered, the caching allocator defers reclaiming blocks freed with uses pending on other streams
(`record_stream`, as NCCL's collectives do), as it does during CUDA graph capture: single-stream training has none.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from thunderfx_debug.recording.check import kept_random_state, tensors
from thunderfx_debug.recording.turns import Turn
from thunderfx_debug.thunder import torch_private


class CheckIsolation:
    """The pool and stream of each CUDA device the checks ran on, made on first use; `entered(values)` is the context
    for a check's work on `values` (the run's tensors it reads). On CPU only the random state is kept."""

    def __init__(self):
        self._pools: dict[int, Any] = {}
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._inside = threading.local()  # entered by this thread already (a check's work calling another's)

    def __reduce__(self):
        """A copy (a deep-copied model holding its compiled backend, a pickled trainer) gets pools and streams of its
        own, made on first use: neither can be copied."""
        return (CheckIsolation, ())

    def _device(self, values: list[Any]) -> int | None:
        for t in tensors(values):
            if t.is_cuda:
                return t.device.index if t.device.index is not None else torch.cuda.current_device()
        return None

    @contextlib.contextmanager
    def entered(self, values: Iterable[Any] = (), turn: Turn | None = None) -> Iterator[None]:
        """`turn`: the split whose check this work is, charged its wall time, the wait for the check's stream
        included (`turns.Turns`)."""
        values = list(values)
        device = self._device(values)
        with turn.spending() if turn is not None else contextlib.nullcontext(), kept_random_state(values):
            if device is None or getattr(self._inside, "device", None) == device:
                yield
                return
            if device not in self._pools:
                with torch.cuda.device(device):
                    self._pools[device] = torch.cuda.MemPool()
                    self._streams[device] = torch.cuda.Stream(device)
            stream, pool = self._streams[device], self._pools[device]
            stream.wait_stream(torch.cuda.current_stream(device))
            self._inside.device = device
            try:
                with torch.cuda.device(device), torch.cuda.stream(stream), torch_private.allocating_to(pool, device):
                    yield
            finally:
                self._inside.device = None
                stream.synchronize()
