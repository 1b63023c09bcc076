"""Where the correctness sentinel's work runs, so that a checked call leaves the training exactly as an unchecked one
would: the same random numbers, the same memory layout, the same library state.

On CUDA, everything a check allocates and runs (copies of inputs and outputs, eager and float64 references, the
comparisons) goes into a memory pool of its own (`torch.cuda.MemPool`) on a stream of its own, per device:
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
- The pool lives as long as one entry: when the check's work returns to the training, the pool is dropped and its
  memory goes back to the device (a `MemPool` empties its cache when it is destroyed), so that a later step of the
  training finds the device as it would without the check. What a check keeps from one entry to the next (the
  inputs of a checked call until its backward, the gradients its hooks note, the copies that show whether a region's
  outputs held) lives on the host (`to_host`), and goes back to the device only for the entry that compares it
  (`on_device`). A check that cannot get the device memory it needs is not checked, and says so (`check.guarded`).
- The stream: cuBLAS keeps a workspace per (handle, stream), allocated on first use; on the training's stream the
  check's first matmul would allocate the training's workspace (in the check's pool), so that the training then
  allocates nothing where it otherwise would. On a stream of its own the check has its own workspaces, made once
  when the stream is (matmuls of each floating dtype, forward and backward, so that autograd's device thread has its
  own too) in a small pool that is kept: a workspace made in a dropped pool would keep that pool's memory held.
- Ordering: the check's stream waits for the training's before the check reads anything, and the host waits for the
  check's stream before handing control back, so that no kernel of the check still reads a tensor of the run that the
  run may free and reuse after the check returned (no `record_stream` either: it would delay the reuse of the run's
  own blocks, and so change their layout).
The CPU and CUDA random states are saved and restored around every entry (`check.kept_random_state`).

What stays shared: library state that a first use initialises outside the caching allocator (cuBLAS handles, lazily
loaded kernel modules), which changes no result; the kept workspaces (cuBLAS's, a few tens of MiB per device at most);
the device's free memory while an entry runs; and, while a check is entered, the caching allocator defers reclaiming
blocks freed with uses pending on other streams (`record_stream`, as NCCL's collectives do), as it does during CUDA
graph capture: single-stream training has none.
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
    """The stream of each CUDA device the checks ran on, made on first use, and a pool per entry; `entered(values)` is
    the context for a check's work on `values` (the run's tensors it reads). On CPU only the random state is kept."""

    def __init__(self):
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._workspaces: dict[int, Any] = {}  # device -> the pool that holds the check stream's library workspaces
        self._inside = threading.local()  # entered by this thread already (a check's work calling another's)

    def __reduce__(self):
        """A copy (a deep-copied model holding its compiled backend, a pickled trainer) gets streams of its own, made
        on first use: neither streams nor pools can be copied."""
        return (CheckIsolation, ())

    def _device(self, values: list[Any]) -> int | None:
        for t in tensors(values):
            if t.is_cuda:
                return t.device.index if t.device.index is not None else torch.cuda.current_device()
        return None

    @contextlib.contextmanager
    def entered(self, values: Iterable[Any] = (), turn: Turn | None = None,
                device: int | None = None) -> Iterator[None]:
        """`turn`: the split whose check this work is, charged its wall time, the wait for the check's stream
        included (`turns.Turns`); `device`: the CUDA device the work runs on, where `values` (host copies) do not
        say."""
        values = list(values)
        device = self._device(values) if device is None else device
        with turn.spending() if turn is not None else contextlib.nullcontext(), kept_random_state(values):
            if device is None or getattr(self._inside, "device", None) == device:
                yield
                return
            stream = self._stream(device)
            with torch.cuda.device(device):
                pool = torch.cuda.MemPool()
            stream.wait_stream(torch.cuda.current_stream(device))
            self._inside.device = device
            try:
                with torch.cuda.device(device), torch.cuda.stream(stream), torch_private.allocating_to(pool, device):
                    yield
            finally:
                self._inside.device = None
                stream.synchronize()
                del pool  # its cached memory back to the device; a block still in use goes back once freed

    def _stream(self, device: int) -> torch.cuda.Stream:
        """The check's stream on `device`, with its library workspaces made (see the module docstring)."""
        stream = self._streams.get(device)
        if stream is not None:
            return stream
        with torch.cuda.device(device):
            stream, pool = torch.cuda.Stream(device), torch.cuda.MemPool()
            stream.wait_stream(torch.cuda.current_stream(device))
            with kept_random_state([]), torch.cuda.stream(stream), torch_private.allocating_to(pool, device):
                for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                    a = torch.ones(16, 16, dtype=dtype, device=device, requires_grad=True)
                    torch.autograd.grad(torch.addmm(a[0], a, a).sum() + (a @ a).sum(), a)
            stream.synchronize()
        self._streams[device], self._workspaces[device] = stream, pool
        return stream


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` on the host, laid out as `t` (what a check keeps between two entries; on CPU a copy)."""
    return t.detach().to("cpu", copy=True)


def on_device(kept: Any, device: torch.device) -> Any:
    """What `to_host` kept, on `device` again (within an entry: in the check's pool); anything else as it is."""
    return kept.to(device) if isinstance(kept, torch.Tensor) else kept
