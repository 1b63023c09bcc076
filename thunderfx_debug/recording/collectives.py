"""The collectives of the run, read from torch.distributed's flight recorder at flush time (never on the training
path).

The flight recorder is c10d's own ring buffer of the last N collectives of the process (all process groups), kept
when the user turns it on: TORCH_FR_BUFFER_SIZE=N (TORCH_NCCL_TRACE_BUFFER_SIZE=N with NCCL; PyTorch's own tool
`torch.distributed.flight_recorder` reads the same buffer after a hang). It records each collective when the host
enqueues it, with its process group and sequence number, so the same collective can be found on every rank; with
NCCL and TORCH_NCCL_ENABLE_TIMING=1 it also times each on the device (start and end CUDA events). It sees the
collectives that run outside the compiled graphs (DDP's bucket all-reduces, FSDP2's all-gathers and reduce-scatters),
which nothing inside the graphs can time. Without the variable there is no buffer and nothing is read.

Checked against torch 2.11-2.13: `torch._C._distributed_c10d._dump_nccl_trace_json` (NCCL builds) and
`_dump_fr_trace_json` (other backends, gloo) return the buffer as JSON, entries with `profiling_name`,
`process_group` ([name, description]), `collective_seq_id`, `time_created_ns`, `input_sizes`, `duration_ms`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from thunderfx_debug.records import CollectiveCall, CollectiveLog
from thunderfx_debug.thunder import torch_private

BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def buffer_size(environ=os.environ) -> int:
    """The flight recorder's capacity as c10d reads it from the environment (0: off; a malformed value is off, as
    c10d treats it).

    Example:
        >>> buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}), buffer_size({})
        (2000, 0)
    """
    for variable in BUFFER_VARIABLES:
        if variable in environ:
            try:
                return max(0, int(environ[variable]))
            except ValueError:
                return 0
    return 0


def _dump_functions(backend: str | None) -> list[str]:
    names = ["_dump_nccl_trace_json", "_dump_fr_trace_json"]
    return names if backend == "nccl" else names[::-1]


def _backend() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return None


def read_flight_recorder(since_ns: int = 0) -> CollectiveLog | None:
    """The collectives in this process's flight recorder now, those enqueued from `since_ns` on (system clock, ns
    since the epoch: the backend passes the time it was built, so that the log is of its own run); None when it is
    off, holds nothing, or this torch has no way to read it. Off the training path: at flush."""
    capacity = buffer_size()
    if capacity == 0:
        return None
    import torch.distributed as dist

    if not dist.is_available():
        return None
    for name in _dump_functions(_backend()):
        dump = torch_private.c10d_function(name)
        if dump is None:
            continue
        try:
            text = dump(includeCollectives=True, onlyActive=False)
        except TypeError:  # an older signature without keywords
            text = dump()
        calls = [c for c in parse_entries(json.loads(text).get("entries", [])) if c.created_ns >= since_ns]
        if calls:
            return CollectiveLog(source=name, capacity=capacity, calls=tuple(calls))
    return None


def _elements(sizes: Any) -> int:
    if not isinstance(sizes, list):
        return 0
    return sum(math.prod(int(s) for s in shape) for shape in sizes if isinstance(shape, list))


def parse_entries(entries: list[dict[str, Any]]) -> list[CollectiveCall]:
    """The collectives (not point-to-point sends) of flight-recorder entries.

    Example:
        >>> entry = {"profiling_name": "gloo:all_reduce", "process_group": ["0", "default_pg"], "is_p2p": False,
        ...          "collective_seq_id": 3, "time_created_ns": 10**18, "input_sizes": [[4, 8]], "duration_ms": None}
        >>> parse_entries([entry])
        [CollectiveCall(name='gloo:all_reduce', group='0', seq=3, created_ns=1000000000000000000, elements=32, duration_ms=None)]
    """
    calls = []
    for entry in entries:
        if entry.get("is_p2p") or not entry.get("collective_seq_id"):
            continue
        group = entry.get("process_group")
        duration = entry.get("duration_ms")
        calls.append(CollectiveCall(
            name=str(entry.get("profiling_name", "?")),
            group=str(group[0] if isinstance(group, list) and group else group),
            seq=int(entry["collective_seq_id"]),
            created_ns=int(entry.get("time_created_ns", 0)),
            elements=_elements(entry.get("input_sizes")),
            duration_ms=float(duration) if isinstance(duration, (int, float)) and duration >= 0 else None,
        ))
    return calls
