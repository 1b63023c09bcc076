"""Step time of ReportingBackend against plain ThunderCompiler, as ratios measured in one process.

    source .gpu/setup.sh && python benchmarks/overhead.py --json overhead.json    # H200: 12-layer GPT, ~4-5 min
    python benchmarks/overhead.py --tiny                                          # CPU smoke test, ~1-2 min

Three configurations train the same model (same initial weights, same batches, AdamW):
  thunderfx        plain `thunder.dynamo.ThunderCompiler`
  defaults         `ReportingBackend()` with its default settings (graph timing every 50 calls, no dump)
  fusion           `ReportingBackend(timing="fusion", timing_every=50)`: every fusion region timed every 50 calls
Targets (issue 4): defaults <= 1.01x and fusion <= 1.03x the step time of thunderfx.

Method. The three are compiled and warmed up in the same process, each with its own copy of the model and optimizer,
then measured in interleaved blocks of `--block` steps, the order of the three rotated every round, so that drift
(clocks, temperature, other load) hits all three alike. Step boundaries are CUDA events (host time on CPU) recorded
without synchronising; the device is synchronised only at the end of a block. The headline is the ratio of mean step
times over all measured steps, because a sampled step costs more than others and a median would hide it: with 100
measured steps from call 11 on, calls 56 and 106 are sampled, the rate a long run sees. Medians, p10/p90 and a noise
floor (plain ThunderCompiler's even rounds against its odd rounds) are printed alongside. THUNDERFX_DEBUG_*
variables are cleared first: they would override the settings compared here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)
from thunderfx_debug.models import GPT, GPT_12_LAYER, GPTConfig, param_count, synthetic_batches

TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
TARGETS = {"defaults": 1.01, "fusion": 1.03}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT (CPU works): a smoke test of this script")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per configuration (default 100; tiny 20)")
    parser.add_argument("--block", type=int, default=None, help="steps per interleaved block (default 10; tiny 5)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured steps per configuration (compile included)")
    parser.add_argument("--every", type=int, default=None, help="THUNDERFX_DEBUG_TIMING_EVERY of the two reporting "
                        "configurations (default 50; tiny 5, so that the smoke test samples)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; tiny 4)")
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks of the GPT (default 12; fewer to fit "
                        "a short device lease: per-step overhead is per graph and split, so fewer layers is the harder case)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.steps = args.steps or (20 if args.tiny else 100)
    args.block = args.block or (5 if args.tiny else 10)
    args.every = args.every or (5 if args.tiny else 50)
    args.batch = args.batch or (4 if args.tiny else 8)
    if args.steps % args.block:
        parser.error(f"--steps ({args.steps}) must be a multiple of --block ({args.block})")
    return args


def clear_debug_environment() -> list[str]:
    cleared = sorted(name for name in os.environ if name.startswith("THUNDERFX_DEBUG_"))
    for name in cleared:
        del os.environ[name]
    return cleared


def thunder_options(device: str) -> dict:
    """Thunder's defaults on CUDA (nvFuser fuses); on CPU its torch.compile executor, the one that fuses there."""
    if device.startswith("cuda"):
        return {}
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    return {"executors": [torch_compile_ex, *thunder.get_default_executors()]}


def make_backends(device: str, every: int) -> dict:
    from thunder.dynamo import ThunderCompiler

    from thunderfx_debug import ReportingBackend

    options = thunder_options(device)
    return {
        "thunderfx": ThunderCompiler(**options),
        "defaults": ReportingBackend(**options, timing_every=every) if every != 50 else ReportingBackend(**options),
        "fusion": ReportingBackend(**options, timing="fusion", timing_every=every),
    }


class Trainer:
    """One configuration: its compiled model, optimizer, and step-boundary marks."""

    def __init__(self, name: str, backend, config: GPTConfig, device: str, dtype: torch.dtype, batches):
        torch.manual_seed(0)
        self.name, self.backend, self.device = name, backend, device
        self.model = GPT(config).to(device=device, dtype=dtype)
        self.compiled = torch.compile(self.model, backend=backend)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batches = batches
        self.steps_done = 0
        self.step_ms: list[float] = []
        self.block_mean_ms: list[float] = []

    def step(self) -> None:
        tokens, targets = self.batches[self.steps_done % len(self.batches)]
        loss = self.compiled(tokens, targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1

    def run_block(self, steps: int) -> None:
        """`steps` steps with a mark at each boundary; synchronises once, at the end."""
        cuda = self.device.startswith("cuda")
        marks = []
        for _ in range(steps):
            marks.append(_mark(cuda))
            self.step()
        marks.append(_mark(cuda))
        if cuda:
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        else:
            times = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
        self.step_ms += times
        self.block_mean_ms.append(statistics.fmean(times))


def _mark(cuda: bool):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def summarize(times: list[float]) -> dict:
    ordered = sorted(times)

    def quantile(q):
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "steps": len(times),
        "mean_ms": statistics.fmean(times),
        "median_ms": statistics.median(times),
        "p10_ms": quantile(0.10),
        "p90_ms": quantile(0.90),
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
    }


def fusion_coverage(backend) -> dict:
    """How many fusion regions the fusion configuration timed, and with how many samples (the proof it was on)."""
    report = backend.report()
    fusions = [f for g in report.graphs for _, f in g.fusions()]
    counts = [f.timing.count for f in fusions if f.timing is not None]
    return {"regions": len(fusions), "timed_regions": len(counts), "samples_per_region": sorted(set(counts))}


def main(argv=None) -> int:
    args = parse_args(argv)
    cleared = clear_debug_environment()
    if cleared:
        print(f"note: cleared {', '.join(cleared)} (they would override the settings compared here)")
    config = TINY if args.tiny else dataclasses.replace(GPT_12_LAYER, n_layer=args.layers)
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    batches = [b for _, b in zip(range(8), synthetic_batches(config, args.batch, args.device))]
    trainers = [Trainer(name, backend, config, args.device, dtype, batches)
                for name, backend in make_backends(args.device, args.every).items()]
    print(f"model: GPT {config.n_layer} layers, d={config.n_embd}, seq {config.block_size}, batch {args.batch}, "
          f"{param_count(trainers[0].model) / 1e6:.1f}M parameters, {dtype}, AdamW, on {args.device}")

    for trainer in trainers:
        started = time.perf_counter()
        for _ in range(args.warmup):
            trainer.step()
        if cuda:
            torch.cuda.synchronize()
        print(f"  {trainer.name}: compiled and warmed up ({args.warmup} steps) in {time.perf_counter() - started:.1f} s")
    _check_each_backend_ran_its_own_graphs(trainers, args.warmup)

    rounds = args.steps // args.block
    for round_index in range(rounds):
        order = trainers[round_index % len(trainers):] + trainers[:round_index % len(trainers)]
        for trainer in order:
            trainer.run_block(args.block)

    results = {t.name: summarize(t.step_ms) for t in trainers}
    base = results["thunderfx"]
    for name, result in results.items():
        result["ratio_mean"] = result["mean_ms"] / base["mean_ms"]
        result["ratio_median"] = result["median_ms"] / base["median_ms"]
    plain_blocks = trainers[0].block_mean_ms
    noise_floor = statistics.fmean(plain_blocks[0::2]) / statistics.fmean(plain_blocks[1::2]) if rounds > 1 else None
    coverage = fusion_coverage(trainers[2].backend)
    verdicts = {name: results[name]["ratio_mean"] <= target for name, target in TARGETS.items()}

    print(f"\n{'configuration':<12} {'mean ms':>9} {'median':>9} {'p10':>9} {'p90':>9} {'x mean':>8} {'x median':>9}  target")
    for name, r in results.items():
        target = f"<= {TARGETS[name]:.2f}x {'ok' if verdicts[name] else 'MISSED'}" if name in TARGETS else ""
        print(f"{name:<12} {r['mean_ms']:9.3f} {r['median_ms']:9.3f} {r['p10_ms']:9.3f} {r['p90_ms']:9.3f} "
              f"{r['ratio_mean']:8.4f} {r['ratio_median']:9.4f}  {target}")
    if noise_floor is not None:
        print(f"noise floor: thunderfx's even rounds / odd rounds = {noise_floor:.4f}")
    print(f"fusion configuration timed {coverage['timed_regions']} of {coverage['regions']} fusion regions, "
          f"samples per region: {coverage['samples_per_region']}")

    if args.json is not None:
        data = {
            "benchmark": "overhead",
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "environment": _environment(args.device),
            "model": {"n_layer": config.n_layer, "n_embd": config.n_embd, "seq": config.block_size,
                      "vocab_size": config.vocab_size, "batch": args.batch, "dtype": str(dtype)},
            "settings": {"warmup_steps": args.warmup, "measured_steps": args.steps, "block": args.block,
                         "timing_every": args.every},
            "results": results,
            "targets": TARGETS,
            "meets_targets": verdicts,
            "noise_floor": noise_floor,
            "fusion_coverage": coverage,
            "step_ms": {t.name: t.step_ms for t in trainers},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1))
        print(f"wrote {args.json}")
    return 0


def _check_each_backend_ran_its_own_graphs(trainers, warmup: int) -> None:
    """Dynamo caches compiled frames per backend; this makes sure no configuration ran another one's graphs."""
    for trainer in trainers:
        backend = trainer.backend
        if hasattr(backend, "report"):
            calls = [g.calls for g in backend.report().graphs]
            ok = bool(calls) and all(c == warmup for c in calls)
        else:
            ok = bool(backend.subgraph_infos)
        if not ok:
            raise SystemExit(f"{trainer.name}: its backend did not run its own graphs during the warm-up; "
                             "the comparison would be meaningless")


def _environment(device: str) -> dict:
    import thunder

    env = {"python": platform.python_version(), "torch": torch.__version__, "thunder": thunder.__version__,
           "device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        try:
            import nvfuser_direct as nvfuser
        except ImportError:
            try:
                import nvfuser
            except ImportError:
                nvfuser = None
        env["nvfuser"] = getattr(nvfuser, "__version__", None) if nvfuser else None
    return env


if __name__ == "__main__":
    sys.exit(main())
