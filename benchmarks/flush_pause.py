"""What the periodic flush (THUNDERFX_DEBUG_FLUSH_EVERY) costs the training: the training thread's pause per flush,
the steps a flush overlaps, and the clock check every graph call pays.

    source .gpu/setup.sh && python3 benchmarks/flush_pause.py --json flush_pause.json   # H200: 12-layer GPT
    python benchmarks/flush_pause.py --tiny                                              # CPU smoke test, ~1 min

The model is `thunderfx_debug.commands.models.GPT` (12 layers, d 768, seq 1024, batch 8, bf16 on CUDA; --tiny: 2
layers of d 32, seq 16, float32), trained with AdamW under ReportingBackend(dump_dir=<temp dir>, repro="all",
timing="fusion", timing_every=50, flush_every=--every): every script of every graph, split and fusion region, and
every fusion region timed, the most a flush has to do. The first periodic flush comes with the first step after the
compile and makes every script; the run then trains until --flushes more periodic flushes have been written.

Figures:
  pause    per periodic flush after the first, the training thread's time in it (`backend.flush_history`: records
           built, timing samples read without waiting for the device, nothing regenerated): median and worst.
           Target: under 50 ms.
  writer   the writer thread's time per flush (serialising graph.json, summary, trace.json, manifest and writing
           the files that changed; concurrently with training), and the files written and left unchanged.
  steps    host time per step (on CUDA each step ends with a device synchronisation, so it is the step's time):
           the median over steps that overlapped no flush, and the excess over it of steps that overlapped one (the
           pause, plus the writer thread's share of the GIL): median and worst.
  check    the clock check of `GraphRunner` with a periodic flush that is never due, against none, on a graph that
           does nothing (timeit, --check-rounds interleaved rounds): nanoseconds per graph call.
The first flush's own pause (it makes the scripts) is printed apart.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
import torch

from thunderfx_debug.commands.models import GPT, GPT_12_LAYER, GPTConfig, synthetic_batches

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
TARGET_MS = 50.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT (CPU works): a smoke test of this script")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default 12; tiny 2)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; tiny 4)")
    parser.add_argument("--every", type=float, default=None, help="THUNDERFX_DEBUG_FLUSH_EVERY in seconds (default "
                        "2: many flushes in a short run; a flush's pause does not depend on the period)")
    parser.add_argument("--flushes", type=int, default=10, help="periodic flushes measured after the first")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="stop training after this long past the compile, however many flushes (default 300)")
    parser.add_argument("--executors", default=None, help="comma list of Thunder executor names (default: Thunder's "
                        "defaults on CUDA, nvFuser fusing; on CPU its torch.compile executor first)")
    parser.add_argument("--check-rounds", type=int, default=15, help="rounds of the clock check's measurement")
    parser.add_argument("--cpu-threads", type=int, default=1, help="torch's intra-op threads on CPU (default 1: "
                        "threads for every core leave none to the writer thread, and torch's parallel regions then "
                        "wait for a preempted thread of theirs; ignored on CUDA)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.layers = args.layers or (2 if args.tiny else 12)
    args.batch = args.batch or (4 if args.tiny else 8)
    args.every = args.every or 2.0
    if args.flushes < 1:
        parser.error("--flushes must be at least 1")
    return args


def check_cost_ns(rounds: int, calls: int = 200_000) -> dict:
    """GraphRunner's time per call with a never-due periodic flush minus without one, on a graph of nothing."""
    from types import SimpleNamespace

    from internals import GraphRunner, PeriodicFlush, Sampling

    def runner(periodic):
        return GraphRunner(SimpleNamespace(calls=0), lambda *args: None, Sampling(1, 0, enabled=False), None, None,
                           None, periodic=periodic)

    runners = {"without": runner(None), "with": runner(PeriodicFlush(1e12, lambda: None))}
    per_call: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name in random.sample(list(runners), len(runners)):
            seconds = timeit.Timer("run()", globals={"run": runners[name]}).timeit(calls)
            per_call[name].append(seconds / calls * 1e9)
    without, with_check = statistics.median(per_call["without"]), statistics.median(per_call["with"])
    return {"ns_per_call_without": without, "ns_per_call_with": with_check, "check_ns": with_check - without}


def train(args, device: str) -> dict:
    from thunderfx_debug import ReportingBackend

    cuda = device == "cuda"
    config = TINY if args.tiny else GPT_12_LAYER
    config = GPTConfig(**{**config.__dict__, "n_layer": args.layers})
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    dump_dir = Path(tempfile.mkdtemp(prefix="thunderfx_debug_flush_pause_"))
    backend = ReportingBackend(dump_dir=dump_dir, repro="all", timing="fusion", timing_every=50,
                               flush_every=args.every, **harness.thunder_options(device, args.executors))
    batches = [b for _, b in zip(range(8), synthetic_batches(config, args.batch, device))]
    trainer = harness.Trainer(model, backend, batches, lr=1e-4, device=device)

    def step(i: int) -> tuple[float, float]:
        started = time.monotonic()
        trainer.step()
        trainer.clock.sync()
        return started, time.monotonic()

    compile_started = time.monotonic()
    steps = [step(0)]
    compile_s = time.monotonic() - compile_started
    backend.wait_for_flush()  # the first flush (every script made), before the measurement
    measuring_from = time.monotonic()
    i = 1
    while len(backend.flush_history) < args.flushes + 1 and time.monotonic() - measuring_from < args.max_seconds:
        steps.append(step(i))
        i += 1
    backend.wait_for_flush()
    history = backend.flush_history
    files = [p for p in dump_dir.rglob("*") if p.is_file()]
    report = backend.report()
    return {
        "compile_s": compile_s, "steps": len(steps), "history": history, "steps_times": steps[1:],
        "dump": {"dir": str(dump_dir), "files": len(files), "mb": sum(p.stat().st_size for p in files) / 2**20},
        "pieces_timed": sum(1 for g in report.graphs for t in _timings(g) if t is not None and t.count),
        "scripts": sum(1 for p in files if p.suffix == ".py" and "_repro_" in p.name),
    }


def _timings(graph):
    yield graph.timing
    yield graph.backward_timing
    for split in graph.splits:
        yield split.timing
        yield split.backward_timing
        yield from split.outside_fusions_timing.values()
        for fusion in split.fusions:
            yield fusion.timing


def summarise(run: dict) -> dict:
    history = [h for h in run["history"] if h.kind == "periodic"]
    if len(history) < 2:
        raise SystemExit(f"only {len(history)} periodic flushes were written in the time allowed; raise "
                         "--max-seconds or lower --every")
    first, later = history[0], history[1:]
    windows = [(h.started_s, h.started_s + (h.training_thread_ms + h.writer_ms) / 1e3) for h in later]
    clean, during = [], []
    for start, end in run["steps_times"]:
        overlapping = any(start < w_end and w_start < end for w_start, w_end in windows)
        (during if overlapping else clean).append((end - start) * 1e3)
    median_step = statistics.median(clean) if clean else None
    excess = [ms - median_step for ms in during] if median_step is not None else []
    pauses = [h.training_thread_ms for h in later]
    return {
        "first_flush": {"training_thread_ms": first.training_thread_ms, "writer_ms": first.writer_ms,
                        "files_written": first.files_written},
        "flushes_measured": len(later),
        "pause_ms": {"median": statistics.median(pauses) if pauses else None, "worst": max(pauses, default=None),
                     "all": pauses},
        "writer_ms": {"median": statistics.median([h.writer_ms for h in later]) if later else None,
                      "worst": max((h.writer_ms for h in later), default=None)},
        "files": {"written": sorted({h.files_written for h in later}),
                  "unchanged": sorted({h.files_unchanged for h in later})},
        "step_ms": {"median_without_flush": median_step, "steps_without_flush": len(clean),
                    "steps_overlapping_a_flush": len(during),
                    "excess_median": statistics.median(excess) if excess else None,
                    "excess_worst": max(excess, default=None)},
    }


def print_figures(args, device: str, run: dict, result: dict, check: dict) -> None:
    print(f"clock check per graph call: {check['check_ns']:.1f} ns "
          f"({check['ns_per_call_without']:.1f} ns without, {check['ns_per_call_with']:.1f} ns with)")
    print(f"model: GPT, {args.layers} layers on {device}; compile {run['compile_s']:.1f} s; {run['steps']} steps; "
          f"{run['pieces_timed']} timed pieces; {run['scripts']} repro scripts; dump {run['dump']['mb']:.1f} MB in "
          f"{run['dump']['files']} files")
    first, pause = result["first_flush"], result["pause_ms"]
    print(f"first flush (makes every script): {first['training_thread_ms']:.1f} ms in the training thread, writer "
          f"{first['writer_ms']:.1f} ms, {first['files_written']} files")
    print(f"periodic flushes after the first: {result['flushes_measured']}")
    if pause["median"] is not None:
        print(f"  training-thread pause per flush: median {pause['median']:.2f} ms, worst {pause['worst']:.2f} ms "
              f"(target < {TARGET_MS:.0f} ms: {'met' if pause['worst'] < TARGET_MS else 'NOT MET'})")
        print(f"  writer thread per flush: median {result['writer_ms']['median']:.1f} ms, worst "
              f"{result['writer_ms']['worst']:.1f} ms; files written {result['files']['written']}, left unchanged "
              f"{result['files']['unchanged']}")
    steps = result["step_ms"]
    if steps["median_without_flush"] is not None and steps["excess_median"] is not None:
        print(f"  step: median {steps['median_without_flush']:.2f} ms without a flush ({steps['steps_without_flush']} "
              f"steps); steps overlapping one ({steps['steps_overlapping_a_flush']}): excess median "
              f"{steps['excess_median']:.2f} ms, worst {steps['excess_worst']:.2f} ms")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.cpu_threads)
    check = check_cost_ns(args.check_rounds)
    run = train(args, device)
    result = summarise(run)
    print_figures(args, device, run, result, check)
    harness.write_record(args.json, "flush_pause", {
        "device": device, "settings": vars(args), "check": check, "compile_s": run["compile_s"], "steps": run["steps"],
        "dump": run["dump"], "pieces_timed": run["pieces_timed"], "scripts": run["scripts"], **result}, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
