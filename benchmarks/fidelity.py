"""Fidelity of fusion-level timing: each fusion region's time as ReportingBackend measures it (CUDA events around
the region, read lazily) against the time torch.profiler measures for the kernels of the same region; and, with
`--step` (implied by `--model llama`), a whole training step attributed part by part against the profiler's kernel
total of the same step.

    source .gpu/setup.sh && python benchmarks/fidelity.py --json fidelity.json    # H200: 12-layer GPT, ~2-3 min
    source .gpu/setup.sh && python benchmarks/fidelity.py --model llama --json fidelity_llama.json   # H200, ~3 min
    python benchmarks/fidelity.py --tiny                                          # CPU smoke test (host times)
    python benchmarks/fidelity.py --tiny --step                                   # CPU smoke test of --step

Method. One training run under `ReportingBackend(timing="fusion", timing_every=1, nvtx=True)`. With `nvtx=True`
each fusion region runs inside a `torch.profiler.record_function` range (and an NVTX range) named after the region,
"graph0/thunder_0/nvFusion3_forward": the very key of the region in the report, so matching needs no guessing.
The range is opened before the region's start mark and closed after its end mark. After the warm-up (compile
included), `--steps` steps run under torch.profiler (CPU and CUDA activities):
  - backend: the region's samples on those calls (CUDA events recorded before and after the region on the stream);
  - profiler: for each occurrence of the region's range, the summed duration of the kernels (and memcpy/memset)
    the profiler recorded on the GPU inside the range's span on the GPU timeline (Kineto lays each `record_function`
    range on the GPU from its first to its last kernel). The sum is taken over the GPU timeline because the
    profiler's own attribution (`FunctionEvent.device_time_total`, through CUPTI correlation ids) gives nvFuser's
    ranges almost nothing: nvFuser launches through the driver API outside the dispatcher. That attribution and the
    span itself are reported alongside.
Per region, the ratio of the medians (backend / profiler kernel time); the target is within 10%. Events measure the
stream between two points, so gaps between a region's kernels and the events' own cost (about a microsecond) count
as region time, while the profiler counts kernel time only: short regions (a few microseconds) differ most, so the
summary also gives the time-weighted agreement. It also measures the bracket's own cost (`timing.bracket_cost_ms`:
a tiny kernel alone between two events, against its share of 20 back to back) and gives each ratio less that cost,
the candidate correction for short regions. On CPU (--tiny) the profiler side is the range's CPU time instead,
which only checks that the matching works.

Step mode (`--step`; `--model llama`: a Hugging Face LlamaForCausalLM built from a config, `--layers` decoder layers,
no weights downloaded). Each profiled step runs its forward inside a `record_function("fidelity forward")` and its
backward inside `record_function("fidelity backward")`; the profiler's kernel total of a step is the device work
(kernels, memcpy, memset) inside those two ranges on the host clock, each range ending with a device
synchronisation (autograd launches backward kernels from its own thread, outside the main thread's range on the GPU
timeline), less the device hold's sleep kernels (`spin_kernel`). The backend's side is every graph's forward and backward on the same calls, attributed: fusion
regions, op groups outside them (matmul, linear, sdpa, ... by symbol and executor), inductor splits, Thunder's own
(between ops, outside its traces) and the split graph's code between splits; these parts add up to the graphs'
times, and the check is that their sum lies within 5% of the kernel total (`STEP_TOLERANCE`). What the step runs on
the device outside the graphs (the loss's seed gradient, gradient accumulation by autograd) is in the kernel total
only, so the sum reads a little low where that is not negligible; every CUDA event the marks record adds a little
to the parts (`marks_per_step` says how many).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import os
import statistics
import sys
from pathlib import Path

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)
from thunderfx_debug.commands.models import (
    GPT,
    GPT_12_LAYER,
    GPTConfig,
    synthetic_batches,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
TOLERANCE = 0.10
STEP_TOLERANCE = 0.05
#: torch.cuda._sleep's kernel (the device hold of fusion-level timing): not work of the step.
SLEEP_KERNEL = "spin_kernel"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT (CPU works): a smoke test of this script")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--warmup", type=int, default=5, help="unprofiled steps first (compile included)")
    parser.add_argument("--steps", type=int, default=10, help="profiled steps, each one sampled")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; tiny 4)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: GPT 12, Llama 2; fewer "
                        "to fit a short device lease)")
    parser.add_argument("--model", choices=("gpt", "llama"), default="gpt",
                        help="the GPT of thunderfx_debug.commands.models, or a Hugging Face Llama from a config "
                             "(implies --step)")
    parser.add_argument("--step", action="store_true",
                        help="attribute whole steps part by part against the profiler's kernel total")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (Llama; default 2048, tiny 64)")
    parser.add_argument("--hidden", type=int, default=2048, help="Llama hidden size (default 2048)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.batch = args.batch or (4 if args.tiny or args.model == "llama" else 8)
    args.layers = args.layers or (2 if args.model == "llama" else 12)
    args.seq = args.seq or (64 if args.tiny else 2048)
    args.step = args.step or args.model == "llama"
    return args


def _profiled(step, warmup: int, steps: int, cuda: bool):
    """Runs `warmup` unprofiled steps, then `steps` steps under torch.profiler; returns the profiler's events."""
    for i in range(warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profile:
        for i in range(steps):
            step(warmup + i)
        if cuda:
            torch.cuda.synchronize()
    return profile.events()


def profiled_run(args, config: GPTConfig):
    """Trains under the backend; returns (report, {range name: [profiler time of each occurrence, ms]},
    {range name: [GPU span of each occurrence, ms]}, {range name: [attributed kernel time, ms]}, profiled calls)."""
    from thunderfx_debug import ReportingBackend

    cuda = args.device.startswith("cuda")
    backend = ReportingBackend(timing="fusion", timing_every=1, timing_warmup=args.warmup, nvtx=True,
                               **harness.thunder_options(args.device))
    torch.manual_seed(0)
    model = GPT(config).to(device=args.device, dtype=torch.bfloat16 if cuda else torch.float32)
    batches = [b for _, b in zip(range(4), synthetic_batches(config, args.batch, args.device))]
    trainer = harness.Trainer(model, backend, batches, lr=1e-4, device=args.device)
    events = _profiled(lambda i: trainer.step(), args.warmup, args.steps, cuda)
    profiled_calls = set(range(args.warmup + 1, args.warmup + args.steps + 1))

    # Region ranges only ("graph0/thunder_0/nvFusion3_forward"; the trace ranges have a space). The CPU event of a
    # range carries the kernels launched inside it; with CUDA, the profiler also lays the range on the GPU timeline
    # (a user annotation with a device type), from its first kernel's start to its last kernel's end.
    device_work = sorted(
        (e.time_range.start, e.time_range.end) for e in events
        if e.device_type != torch.autograd.DeviceType.CPU and not getattr(e, "is_user_annotation", False)
        and not _is_our_range(e.name)
    )
    attributed: dict[str, list[float]] = {}
    spans: dict[str, list[float]] = {}
    in_span: dict[str, list[float]] = {}
    for event in events:
        if not (_is_our_range(event.name) and "/" in event.name and " " not in event.name):
            continue
        if event.device_type == torch.autograd.DeviceType.CPU:
            micros = event.device_time_total if cuda else event.cpu_time_total
            attributed.setdefault(event.name, []).append(micros / 1e3)
        else:
            spans.setdefault(event.name, []).append(event.time_range.elapsed_us() / 1e3)
            in_span.setdefault(event.name, []).append(
                _work_inside(device_work, event.time_range.start, event.time_range.end) / 1e3)
    reference = in_span if cuda else attributed
    return backend.report(), reference, spans, attributed, profiled_calls


def _is_our_range(name: str) -> bool:
    return name.startswith("graph") and ("/" in name or " " in name)


def _work_inside(work: list[tuple[float, float]], start: float, end: float, slack_us: float = 0.5) -> float:
    """Microseconds of device work (sorted (start, end) intervals, one stream) that lie inside [start, end]."""
    first = bisect.bisect_left(work, (start - slack_us,))
    total = 0.0
    for work_start, work_end in work[first:]:
        if work_start > end + slack_us:
            break
        if work_end <= end + slack_us:
            total += work_end - work_start
    return total


def compare(report, ranges: dict[str, list[float]], spans: dict[str, list[float]], calls: set[int],
            attributed: dict[str, list[float]] | None = None) -> list[dict]:
    rows = []
    for graph in report.graphs:
        for split, fusion in graph.fusions():
            name = f"{graph.name}/{split.name}/{fusion.qualified_name}"
            timing = fusion.timing
            backend_ms = [ms for ms, call in zip(timing.samples_ms, timing.calls) if call in calls] if timing else []
            profiler_ms = ranges.get(name, [])
            row = {"region": name, "executor": fusion.executor, "backend_samples": len(backend_ms),
                   "profiler_samples": len(profiler_ms)}
            if backend_ms and profiler_ms:
                row["backend_median_ms"] = statistics.median(backend_ms)
                row["profiler_median_ms"] = statistics.median(profiler_ms)
                row["ratio"] = row["backend_median_ms"] / row["profiler_median_ms"] if row["profiler_median_ms"] else None
                row["within_tolerance"] = row["ratio"] is not None and abs(row["ratio"] - 1) <= TOLERANCE
            if backend_ms and spans.get(name):
                row["gpu_span_median_ms"] = statistics.median(spans[name])
                row["ratio_to_gpu_span"] = row["backend_median_ms"] / row["gpu_span_median_ms"] \
                    if row["gpu_span_median_ms"] else None
            if backend_ms and attributed and attributed.get(name):
                row["attributed_kernel_median_ms"] = statistics.median(attributed[name])
            rows.append(row)
    return rows


def bracket_cost(device: str) -> float:
    """The calibrated cost of one region's bracket of marks (`timing.bracket_cost_ms`), on the clock the backend
    used: CUDA events behind a device hold, or the host clock on CPU. A tiny in-place add stands for a region."""
    from internals import CudaClock, DeviceHold, HostClock, bracket_cost_ms

    x = torch.zeros(1, device=device)
    if device.startswith("cuda"):
        hold = DeviceHold.for_current_cuda_device()
        return bracket_cost_ms(CudaClock(), lambda: x.add_(1), hold=lambda: hold.sleep_ms(2.0))
    return bracket_cost_ms(HostClock(), lambda: x.add_(1))


def add_net(rows: list[dict], cost_ms: float) -> None:
    """Each matched row's ratio once the bracket's cost is taken off the backend's median (the candidate correction
    for short regions; the backend does not apply it yet)."""
    for row in rows:
        if row.get("ratio") is not None:
            row["net_backend_median_ms"] = max(row["backend_median_ms"] - cost_ms, 0.0)
            row["net_ratio"] = row["net_backend_median_ms"] / row["profiler_median_ms"]
            row["net_within_tolerance"] = abs(row["net_ratio"] - 1) <= TOLERANCE


def summarize(rows: list[dict]) -> dict:
    matched = [r for r in rows if r.get("ratio") is not None]
    backend_total = sum(r["backend_median_ms"] for r in matched)
    profiler_total = sum(r["profiler_median_ms"] for r in matched)
    within = [r for r in matched if r["within_tolerance"]]
    return {
        "regions": len(rows),
        "matched_regions": len(matched),
        "regions_within_tolerance": len(within),
        "share_of_regions_within_tolerance": len(within) / len(matched) if matched else None,
        "share_of_profiler_time_in_regions_within_tolerance":
            sum(r["profiler_median_ms"] for r in within) / profiler_total if profiler_total else None,
        "ratio_of_totals": backend_total / profiler_total if profiler_total else None,
        "median_ratio": statistics.median(r["ratio"] for r in matched) if matched else None,
        "median_ratio_to_gpu_span": statistics.median(spanned) if (spanned := [
            r["ratio_to_gpu_span"] for r in matched if r.get("ratio_to_gpu_span") is not None]) else None,
        "backend_total_ms": backend_total,
        "profiler_total_ms": profiler_total,
        "regions_within_tolerance_net": sum(1 for r in matched if r.get("net_within_tolerance")),
        "median_net_ratio": statistics.median(r["net_ratio"] for r in matched) if matched and "net_ratio" in matched[0]
        else None,
    }


def print_regions(rows: list[dict], summary: dict, device: str) -> None:
    unit = "kernel" if device.startswith("cuda") else "range CPU"
    print(f"{'region':<48} {'backend ms':>11} {f'{unit} ms':>14} {'ratio':>7} {'GPU span ms':>12} {'ratio':>7}")
    for row in sorted(rows, key=lambda r: -r.get("profiler_median_ms", 0.0)):
        if "ratio" not in row:
            print(f"{row['region']:<48} unmatched (backend {row['backend_samples']} samples, "
                  f"profiler {row['profiler_samples']} ranges)")
            continue
        flag = "" if row["within_tolerance"] else "  > 10%"
        span = (f"{row['gpu_span_median_ms']:12.4f} {row['ratio_to_gpu_span']:7.3f}"
                if row.get("ratio_to_gpu_span") is not None else f"{'-':>12} {'-':>7}")
        ratio = f"{row['ratio']:7.3f}" if row["ratio"] is not None else f"{'-':>7}"  # no kernel time in the range
        print(f"{row['region']:<48} {row['backend_median_ms']:11.4f} {row['profiler_median_ms']:14.4f} "
              f"{ratio} {span}{flag}")
    print(f"\n{summary['matched_regions']} of {summary['regions']} regions matched; "
          f"{summary['regions_within_tolerance']} within {TOLERANCE:.0%} "
          f"({(summary['share_of_regions_within_tolerance'] or 0):.0%} of regions, "
          f"{(summary['share_of_profiler_time_in_regions_within_tolerance'] or 0):.0%} of the regions' time); "
          f"sum of medians: backend {summary['backend_total_ms']:.3f} ms vs profiler {summary['profiler_total_ms']:.3f} ms "
          f"(ratio {summary['ratio_of_totals'] or float('nan'):.3f}); median ratio {summary['median_ratio'] or float('nan'):.3f}"
          f" (to the GPU span: {summary['median_ratio_to_gpu_span'] or float('nan'):.3f})")
    print(f"bracket cost {summary['bracket_cost_ms'] * 1e3:.2f} µs (timing.bracket_cost_ms); less that cost, "
          f"{summary['regions_within_tolerance_net']} regions within {TOLERANCE:.0%}, "
          f"median ratio {summary['median_net_ratio'] or float('nan'):.3f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    cleared = sorted(name for name in os.environ if name.startswith("THUNDERFX_DEBUG_"))
    for name in cleared:
        del os.environ[name]
    if cleared:
        print(f"note: cleared {', '.join(cleared)} (they would override the settings this benchmark needs)")
    if args.step:
        return run_step_mode(args, argv)
    config = TINY if args.tiny else dataclasses.replace(GPT_12_LAYER, n_layer=args.layers)
    report, kernels, spans, attributed, calls = profiled_run(args, config)
    rows = compare(report, kernels, spans, calls, attributed if args.device.startswith("cuda") else None)
    cost_ms = bracket_cost(args.device)
    add_net(rows, cost_ms)
    summary = {**summarize(rows), "bracket_cost_ms": cost_ms}
    print_regions(rows, summary, args.device)
    harness.write_record(args.json, "fidelity", {
        "device": args.device, "tolerance": TOLERANCE, "model": {"n_layer": config.n_layer, "n_embd": config.n_embd,
                                                                 "seq": config.block_size, "batch": args.batch},
        "settings": {"warmup_steps": args.warmup, "profiled_steps": args.steps}, "summary": summary, "regions": rows},
        argv)
    return 0 if summary["matched_regions"] else 1


# ---- step mode: a whole step attributed part by part ---------------------------------------------------------------
def build_model(args):
    """(model, batch iterator, loss of a batch) for --model; bf16 on CUDA."""
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    if args.model == "gpt":
        config = TINY if args.tiny else dataclasses.replace(GPT_12_LAYER, n_layer=args.layers)
        model = GPT(config).to(device=args.device, dtype=dtype)
        batches = [b for _, b in zip(range(4), synthetic_batches(config, args.batch, args.device))]
        return model, batches, lambda m, batch: m(*batch), {"model": "gpt", "n_layer": config.n_layer}
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.tiny:
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=args.layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq)
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
                             num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                             num_key_value_heads=args.hidden // 256, max_position_embeddings=args.seq)
    model = LlamaForCausalLM(config).to(device=args.device, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=generator).to(args.device)
               for _ in range(4)]
    described = {"model": "llama", "layers": args.layers, "hidden": config.hidden_size, "seq": args.seq,
                 "batch": args.batch, "vocab": config.vocab_size}
    return model, batches, lambda m, tokens: m(input_ids=tokens, labels=tokens).loss, described


def step_profiled_run(args):
    """Trains under fusion-level timing of every call; profiles the last `--steps` steps with their forward and
    backward in named ranges. Returns (report, [(forward, backward) kernel ms of each profiled step], profiled
    steps)."""
    from thunderfx_debug import ReportingBackend

    cuda = args.device.startswith("cuda")
    options = harness.thunder_options(args.device)
    # Every call after the first is sampled, so that the device hold has learned the host's pace when profiling starts.
    backend = ReportingBackend(timing="fusion", timing_every=1, timing_warmup=1, **options)
    model, batches, loss_of, described = build_model(args)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        # Each range waits for its own device work, so that the work lies inside the range's span on the host
        # clock: autograd launches CUDA backward kernels from its own thread, outside the main thread's range on
        # the GPU timeline.
        with torch.profiler.record_function("fidelity forward"):
            loss = loss_of(compiled, batches[i % len(batches)])
            if cuda:
                torch.cuda.synchronize()
        with torch.profiler.record_function("fidelity backward"):
            loss.backward()
            if cuda:
                torch.cuda.synchronize()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    events = _profiled(step, args.warmup, args.steps, cuda)
    work = sorted((e.time_range.start, e.time_range.end) for e in events
                  if e.device_type != torch.autograd.DeviceType.CPU and not getattr(e, "is_user_annotation", False)
                  and SLEEP_KERNEL not in e.name and not _is_our_range(e.name))
    phases: dict[str, list[float]] = {"fidelity forward": [], "fidelity backward": []}
    for event in sorted(events, key=lambda e: e.time_range.start):
        if event.name not in phases or event.device_type != torch.autograd.DeviceType.CPU:
            continue
        if cuda:
            phases[event.name].append(_work_inside(work, event.time_range.start, event.time_range.end) / 1e3)
        else:
            phases[event.name].append(event.cpu_time_total / 1e3)  # CPU: only checks the bookkeeping
    kernels = list(zip(phases["fidelity forward"], phases["fidelity backward"]))
    return backend.report(), kernels, described


def _at(timing, call: int) -> float:
    if timing is None or call not in timing.calls:
        return 0.0
    return timing.samples_ms[timing.calls.index(call)]


def step_parts(report, back: int) -> dict[str, float]:
    """The backend's parts of the step `back` steps before the last (1: the last), in ms: what each graph's forward
    and backward on that call is made of. They add up to `graphs`, the graphs' own time."""
    from thunderfx_debug.records import BETWEEN_OPS, Phase, SplitKind

    parts = dict.fromkeys(("fusion regions", "ops outside regions", "inductor splits", "Thunder between ops",
                           "Thunder outside its traces", "between splits", "graphs"), 0.0)
    groups: dict[str, float] = {}
    marks = 0
    for graph in report.graphs:
        call = graph.calls - back + 1
        for phase, graph_timing in ((Phase.FORWARD, graph.timing), (Phase.BACKWARD, graph.backward_timing)):
            graph_ms = _at(graph_timing, call)
            parts["graphs"] += graph_ms
            in_splits = 0.0
            for split in graph.splits:
                split_ms = _at(split.timing if phase is Phase.FORWARD else split.backward_timing, call)
                in_splits += split_ms
                if split.kind is SplitKind.INDUCTOR:
                    parts["inductor splits"] += split_ms
                    continue
                regions = sum(_at(f.timing, call) for f in split.fusions_in(phase))
                outside = _at(split.outside_fusions_timing.get(f"outside_{phase.value}"), call)
                parts["fusion regions"] += regions
                parts["Thunder outside its traces"] += split_ms - regions - outside
                ops = [g for g in split.op_groups if g.phase is phase]
                marks += 2 + 2 * len(split.fusions_in(phase)) + sum(g.count for g in ops)
                if not ops:  # ops not marked: the time outside regions is one part
                    parts["ops outside regions"] += outside
                for group in ops:
                    ms = _at(group.timing, call)
                    key = "Thunder between ops" if group.symbol == BETWEEN_OPS else "ops outside regions"
                    parts[key] += ms
                    if group.symbol != BETWEEN_OPS:
                        groups[group.label] = groups.get(group.label, 0.0) + ms
            parts["between splits"] += graph_ms - in_splits
    return {**parts, "marks": marks, "groups": dict(sorted(groups.items(), key=lambda item: -item[1]))}


def run_step_mode(args, argv=None) -> int:
    if args.model == "llama":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("--model llama builds a Hugging Face LlamaForCausalLM: pip install transformers", file=sys.stderr)
            return 2
    report, kernels, described = step_profiled_run(args)
    steps = []
    for back, (forward_ms, backward_ms) in enumerate(reversed(kernels), start=1):
        parts = step_parts(report, back)
        steps.append({**parts, "kernels": forward_ms + backward_ms, "kernels_forward": forward_ms,
                      "kernels_backward": backward_ms})
    steps.reverse()
    if not steps:
        print("no profiled step was matched to its ranges")
        return 1
    keys = [k for k in steps[0] if k not in ("groups",)]
    median = {k: statistics.median(s[k] for s in steps) for k in keys}
    ratio = median["graphs"] / median["kernels"] if median["kernels"] else None
    within = ratio is not None and abs(ratio - 1) <= STEP_TOLERANCE
    clock = "kernel" if args.device.startswith("cuda") else "range CPU"
    print(f"{described} on {args.device}, {len(steps)} profiled steps (medians, ms per step):")
    for key in ("fusion regions", "ops outside regions", "inductor splits", "Thunder between ops",
                "Thunder outside its traces", "between splits"):
        print(f"  {key:<28} {median[key]:10.3f}")
    events = "CUDA events" if args.device.startswith("cuda") else "host clock"
    print(f"  {'parts together':<28} {median['graphs']:10.3f}   (the graphs' forward and backward, {events})")
    print(f"  {f'profiler {clock} total':<28} {median['kernels']:10.3f}   (forward {median['kernels_forward']:.3f}, "
          f"backward {median['kernels_backward']:.3f})")
    largest = list(steps[-1]["groups"].items())[:6]
    print("  largest op groups (last step): " + (", ".join(f"{label} {ms:.3f}" for label, ms in largest) or "none"))
    print(f"  marks per step {median['marks']:.0f}")
    verdict = "within" if within else "NOT within"
    print(f"the attributed parts add up to {ratio:.3f} of the profiler's {clock} total: {verdict} "
          f"{STEP_TOLERANCE:.0%}" if ratio is not None else "no kernel time measured")
    harness.write_record(args.json, "fidelity", {
        "mode": "step", "device": args.device, "tolerance": STEP_TOLERANCE, "model": described,
        "settings": {"warmup_steps": args.warmup, "profiled_steps": args.steps},
        "summary": {**median, "ratio": ratio, "within_tolerance": within}, "steps": steps}, argv)
    return 0 if ratio is not None else 1


if __name__ == "__main__":
    sys.exit(main())
