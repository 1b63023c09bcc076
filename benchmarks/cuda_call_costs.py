"""What the CUDA calls of a fusion-sampled call cost on the host, each alone, on the wall clock (CUDA only).

A sampled call at fusion level records hundreds of CUDA events, reads each one's time, walks the pieces' autograd
graphs and holds the device back with a spin kernel so that the host queues the call's work ahead of it. This
measures those calls one by one, with plain torch, so that the cost of each choice is known before it is made:

- `launch_queue`: behind a long spin kernel, how many back-to-back launches (a tiny kernel each, or a kernel and an
  event record each) the host queues before a launch waits for the device: how far a hold can let the host run
  ahead.
- `event_record`: `Event.record()` (which looks up the current stream each time), `Event.record(stream)`, and a new
  event made and recorded.
- `elapsed_time`: reading one completed event's time from a first one: `Event.elapsed_time` (torch queries both
  events and sets the device before it reads), against the driver's `cuEventElapsedTime` called directly on the
  same events (ctypes, libcuda.so.1), whose readings must be equal.
- `gradient_edge`: finding a parameter's node in the autograd graph with `get_gradient_edge` (a view of the leaf
  each time) against checking a node's `variable`.

Medians over repeats, in microseconds per call.

    python benchmarks/cuda_call_costs.py --json cuda_call_costs.json
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402


def per_call_us(fn, calls: int, repeats: int = 7) -> float:
    """Median over `repeats` of the mean wall time of `calls` calls of `fn(i)`, in µs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for i in range(calls):
            fn(i)
        times.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(times)


def launch_queue(with_events: bool, launches: int = 6000, hold_ms: float = 300.0) -> dict:
    """Launches queued behind a spin kernel of `hold_ms` before the first one that waited (> 1 ms) for the device."""
    x = torch.zeros(16, device="cuda")
    events = [torch.cuda.Event(enable_timing=True) for _ in range(launches)] if with_events else None
    stream = torch.cuda.current_stream()
    x.add_(1)  # the kernel's first launch loads its module, which waits for the device (CUDA's lazy loading)
    torch.cuda.Event(enable_timing=True).record(stream)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(hold_ms * torch.cuda.get_device_properties(0).clock_rate))
    waited_at, longest = None, 0.0
    for i in range(launches):
        start = time.perf_counter_ns()
        x.add_(1)
        if events is not None:
            events[i].record(stream)
        took = (time.perf_counter_ns() - start) / 1e6
        longest = max(longest, took)
        if waited_at is None and took > 1.0:
            waited_at = i
    torch.cuda.synchronize()
    return {"queued_before_a_wait": waited_at, "longest_wait_ms": longest, "launches_tried": launches,
            "an_event_per_launch": with_events}


def driver_elapsed():
    """cuEventElapsedTime of the driver, called on torch's events' handles; None where the driver is not found."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    read = driver.cuEventElapsedTime
    read.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
    read.restype = ctypes.c_int
    out = ctypes.c_float()

    def elapsed(start_handle, end_handle):
        status = read(ctypes.byref(out), start_handle, end_handle)
        return out.value if status == 0 else None

    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000, help="events read per repeat (default 2000)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark measures CUDA calls: it needs a CUDA device")

    results = {"launch_queue": [launch_queue(False), launch_queue(True)]}

    stream, x = torch.cuda.current_stream(), torch.zeros(16, device="cuda")
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(args.events)]
    results["event_record_us"] = {
        "record()": per_call_us(lambda i: pool[i].record(), args.events),
        "record(stream)": per_call_us(lambda i: pool[i].record(stream), args.events),
        "new event, record(stream)": per_call_us(
            lambda i: torch.cuda.Event(enable_timing=True).record(stream), args.events),
        "current_stream()": per_call_us(lambda i: torch.cuda.current_stream(), args.events),
    }
    torch.cuda.synchronize()

    marks = []
    for _ in range(args.events):
        x.add_(1)
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record(stream)
    torch.cuda.synchronize()
    first, handles = marks[0], [m.cuda_event for m in marks]
    readings = {"Event.elapsed_time": per_call_us(lambda i: first.elapsed_time(marks[i]), args.events)}
    elapsed = driver_elapsed()
    if elapsed is not None:
        readings["cuEventElapsedTime (ctypes)"] = per_call_us(lambda i: elapsed(handles[0], handles[i]), args.events)
        torch_ms = [first.elapsed_time(m) for m in marks]
        driver_ms = [elapsed(handles[0], h) for h in handles]
        readings["readings_equal"] = torch_ms == driver_ms
    results["elapsed_time_us"] = readings

    from torch.autograd.graph import get_gradient_edge

    weight = torch.nn.Parameter(torch.randn(16, device="cuda"))
    node = get_gradient_edge(weight).node
    accumulator = type(node)
    results["gradient_edge_us"] = {
        "get_gradient_edge(leaf)": per_call_us(lambda i: get_gradient_edge(weight), args.events),
        "type(node) is AccumulateGrad and node.variable": per_call_us(
            lambda i: type(node) is accumulator and node.variable is weight, args.events),
    }
    for name, value in results.items():
        print(name, value)
    harness.write_record(args.json, "cuda_call_costs", results, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
