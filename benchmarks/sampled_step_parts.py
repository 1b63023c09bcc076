"""What a sampled step costs on the host, part by part, on the wall clock: ReportingBackend's defaults; with
`--timing fusion`, a fusion-sampled step's parts; with `--check fusion`, a checked step's parts too.

    source .gpu/setup.sh && python benchmarks/sampled_step_parts.py --model llama --json sampled_step_llama.json
    source .gpu/setup.sh && python benchmarks/sampled_step_parts.py --model mixtral --timing fusion
    python benchmarks/sampled_step_parts.py --steps 120     # CPU: the tiny Llama
    OMP_NUM_THREADS=1 python benchmarks/sampled_step_parts.py --check fusion --check-every 5 --steps 200

`benchmarks/overhead.py --profile` files cProfile's times under the parts of the training path; cProfile adds about a
microsecond to every call, which inflates a sampled step's many small calls. Here the functions a sampled call runs
(the memory meter's allocator reads and autograd walks, the samplers' clock marks, hooks and host readings) are
wrapped with `perf_counter_ns` accumulators instead, and nothing else is profiled. The model trains `--steps` steps
after a warm-up; per step, its host time (no synchronisation inside the step: on a host-bound step that is the step's
cost) and each part's time. Figures: the median ordinary step, each sampled step and the step after it, and each
part's mean time on sampled steps with and without memory measured (`recording.memory.measures`). Parts nest (a
backward hook's time includes the history it reads), so they do not add up to the step. On CUDA it also times the
allocator calls alone: one `torch.cuda.memory_stats` reading, a snapshot without and with one step's history.

The wrappers reach into the package's recording modules by name (`internals.time_calls` installs them): this is a
diagnostic of their internals, like `path_parts.PARTS`.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import overhead  # noqa: E402

#: (module, owner attribute or None, function name, label) of what is timed.
WRAPPED = (
    ("memory", "CudaAllocator", "counts", "allocator counts"),
    ("memory", "CudaAllocator", "history", "allocator history (snapshot)"),
    ("memory", "CudaAllocator", "record", "allocator history on/off"),
    ("memory", None, "saved_storages", "saved storages"),
    ("memory", None, "parameter_storages", "parameter storages"),
    ("memory", "HistoryPeaks", "__init__", "history sums"),
    ("memory", "HistoryPeaks", "peak", "window peaks"),
    ("memory", "BackwardPeakWindow", "__init__", "autograd walk and hooks (memory)"),
    ("sampler", "BackwardMarks", "__init__", "autograd walk and hooks (sampler)"),
    ("memory", "MemoryProbe", "push", "saved-tensor hooks on"),
    ("memory", "MemoryProbe", "pop", "saved-tensor hooks off"),
    ("memory", "BackwardPeakWindow", "_open", "memory backward start hook"),
    ("memory", "BackwardPeakWindow", "_close", "memory backward end hook (reads the step)"),
    ("sampler", "BackwardMarks", "_on_start", "sampler backward start hook"),
    ("sampler", "BackwardMarks", "_on_end", "sampler backward end hook"),
    ("timing", "SampleSeries", "resolve", "resolving earlier samples"),
    ("timing", "CudaClock", "mark", "CUDA event marks"),
    ("host", "HostWatch", "begin", "host readings (begin)"),
    ("host", "HostWatch", "end", "host readings (end)"),
    ("runners", "ThunderOverhead", "read", "Thunder's host time read"),
)
#: What a checked call runs (`--check fusion`): the split's checks, the regions' references and their judging, the
#: watched outputs (parts nest: a judge runs inside its check).
WRAPPED_CHECK = (
    ("split_check", "SplitCheck", "_check_forward", "split forward check"),
    ("split_check", "SplitCheck", "_arm_backward", "split backward armed"),
    ("split_check", "BackwardCheck", "check", "split backward check"),
    ("split_check", None, "judge", "split judging (inside its checks)"),
    ("region_check", "RegionCheck", "_check", "region references and judging"),
    ("region_check", None, "judge", "region judging (inside the above)"),
    ("region_check", "RegionCheck", "_compare_watched", "watched outputs compared"),
    ("region_check", "RegionCheck", "_watch", "watched outputs copied"),
    ("region_check", "RegionCheck", "begin_trace", "split inputs copied (region check)"),
)

#: What a call sampled at fusion level adds (`--timing fusion`): the region timers' marks (each a CUDA event, pooled,
#: on CUDA) and the reading of earlier traces' marks into samples, and the device hold. The traces call the timers'
#: `begin_trace` and `end_trace` through methods bound when Thunder built them, which no wrapper reaches.
WRAPPED_FUSION = (
    ("timing", "RegionTimer", "_mark", "region and op marks"),
    ("timing", "RegionTimer", "resolve", "reading earlier traces' marks"),
    ("timing", "RegionTimer", "_store", "storing a trace's samples (inside the above)"),
    ("timing", "DeviceHold", "trace_lead", "a trace's lead for the hold (inside the above)"),
    ("timing", "DeviceHold", "begin", "device hold: sizing and queueing the sleep"),
    ("timing", "DeviceHold", "_lead_ms", "device hold: the host's lead read (inside the above)"),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="llama", choices=overhead.MODELS)
    parser.add_argument("--steps", type=int, default=200, help="measured steps (default 200: 4 sampled)")
    parser.add_argument("--warmup", type=int, default=8, help="steps before the measurement (default 8)")
    parser.add_argument("--check", default="off", choices=("off", "fusion"),
                        help="THUNDERFX_DEBUG_CHECK of the backend (default off); with fusion, every --check-every-th "
                             "call is checked and its parts are timed too")
    parser.add_argument("--timing", default="graph", choices=("graph", "fusion"),
                        help="THUNDERFX_DEBUG_TIMING of the backend (default graph, the defaults'); fusion times the "
                        "parts a fusion-sampled call adds too")
    parser.add_argument("--check-every", type=int, default=50, help="THUNDERFX_DEBUG_CHECK_EVERY (default 50)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    return args


def allocator_costs(trainer) -> dict:
    """Microseconds of the allocator calls alone (CUDA)."""
    from internals import MAX_EVENTS, torch_private

    def cost(fn, calls):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - started) / calls / 1e3

    device = torch.cuda.current_device()
    found = {"memory_stats_us": cost(lambda: torch_private.allocator_counts(device), 200),
             "snapshot_without_history_us": cost(torch.cuda.memory._snapshot, 20)}
    torch_private.record_allocator_history(True, MAX_EVENTS)
    try:
        trainer.step()
        found["snapshot_with_one_steps_history_us"] = cost(torch.cuda.memory._snapshot, 5)
        found["events_in_one_step"] = len(torch_private.allocator_history(device))
    finally:
        torch_private.record_allocator_history(False, MAX_EVENTS)
    torch.cuda.synchronize()
    return found


def main(argv=None) -> int:
    args = parse_args(argv)
    from thunderfx_debug import ReportingBackend
    from internals import time_calls

    cuda = torch.cuda.is_available()
    overhead.clear_debug_environment()
    size = overhead.CUDA_SIZE if cuda else harness.SIZES["tiny"]
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    model, batch = harness.build(args.model, size, device, dtype, seed=0)
    checks = {} if args.check == "off" else {"check": args.check, "check_every": args.check_every}
    timing = {} if args.timing == "graph" else {"timing": args.timing}
    backend = ReportingBackend(**checks, **timing, **harness.thunder_options(device))
    trainer = harness.Trainer(model, backend, [batch], lr=1e-4)
    for _ in range(args.warmup):
        trainer.step()
    trainer.clock.sync()
    times: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    time_calls(WRAPPED + (WRAPPED_CHECK if checks else ()) + (WRAPPED_FUSION if timing else ()), times)
    steps = []
    for _ in range(args.steps):
        before = {label: entry[0] for label, entry in times.items()}
        call = trainer.steps_done + 1
        started = time.perf_counter_ns()
        trainer.step()
        host_ns = time.perf_counter_ns() - started
        parts = {label: entry[0] - before.get(label, 0) for label, entry in times.items()}
        steps.append({"call": call, "sampled": backend.is_sampled(call), "checked": backend.is_checked(call),
                      "host_us": host_ns / 1e3,
                      "parts_us": {label: ns / 1e3 for label, ns in parts.items() if ns}})
        if call % 10 == 0:
            trainer.clock.sync()  # keeps the host from running ahead of the device by more than a few steps
    sampled = [s for s in steps if s["sampled"]]
    for step in sampled:  # memory is measured on a schedule of its own among the sampled calls
        step["memory"] = "saved-tensor hooks on" in step["parts_us"]
    checked = [s for s in steps if s["checked"]]
    after = [s for s in steps if s["call"] - 1 in {p["call"] for p in sampled + checked}]
    ordinary = [s for s in steps if not s["sampled"] and not s["checked"] and s not in after]
    results = {
        "model": args.model, "device": device, "steps": args.steps,
        "ordinary_step_us_median": statistics.median(s["host_us"] for s in ordinary) if ordinary else None,
        "sampled_steps": sampled,
        "checked_steps": [{"call": s["call"], "host_us": s["host_us"]} for s in checked],
        "steps_after_sampled_us": [s["host_us"] for s in after],
        "calls_per_sampled_step": {label: entry[1] / max(1, len(sampled)) for label, entry in times.items()},
    }
    for memory, kind in ((True, "with memory"), (False, "without memory")):
        chosen = [s for s in sampled if s["memory"] is memory]
        labels = sorted({label for s in chosen for label in s["parts_us"]})
        results[f"parts_us_mean_sampled_{kind.replace(' ', '_')}"] = {
            label: sum(s["parts_us"].get(label, 0.0) for s in chosen) / len(chosen) for label in labels}
    check_labels = [label for _, _, _, label in WRAPPED_CHECK]
    results["parts_us_mean_checked"] = {
        label: sum(s["parts_us"].get(label, 0.0) for s in checked) / len(checked)
        for label in check_labels if any(label in s["parts_us"] for s in checked)} if checked else {}
    if cuda:
        results["allocator"] = allocator_costs(trainer)
    print(f"{args.model} on {device}: ordinary step {results['ordinary_step_us_median']:.0f} us of host time (median)")
    for step in sampled:
        memory = ", memory measured" if step["memory"] else ""
        print(f"  sampled step {step['call']}: {step['host_us']:.0f} us{memory}")
    for step in checked:
        print(f"  checked step {step['call']}: {step['host_us']:.0f} us")
    if results["parts_us_mean_checked"]:
        print("  parts of a checked step (mean us):")
    for label, us in sorted(results["parts_us_mean_checked"].items(), key=lambda item: -item[1]):
        print(f"    {label:45s} {us:9.1f}")
    for kind in ("with_memory", "without_memory"):
        parts = results[f"parts_us_mean_sampled_{kind}"]
        if parts:
            print(f"  parts of a sampled step {kind.replace('_', ' ')} (mean us):")
        for label, us in sorted(parts.items(), key=lambda item: -item[1]):
            print(f"    {label:45s} {us:9.1f}")
    harness.write_record(args.json, "sampled_step_parts", results, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
