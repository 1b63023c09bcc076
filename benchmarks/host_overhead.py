"""Host cost per call of ReportingBackend's training path, against plain ThunderCompiler, on CPU.

Two graphs of tiny tensors (so the host's work is all there is): one that ThunderFX keeps in 1 split, and one it
cuts into 21 (eleven Thunder splits around ten `torch.sinc`s, which Thunder 0.2.6 sends to inductor). Each is compiled
under plain ThunderCompiler (twice: the second copy's distance from the first is the noise floor) and under
ReportingBackend with timing off and with its defaults (graph timing every 50 calls after 5), all in this one
process. The configurations are timed in interleaved rounds (each round times every
configuration once, in a shuffled order, for `--calls` calls), so that drift of the machine hits all of them alike,
and each configuration's figure is its median over rounds of the mean time per call. The forward runs under
`torch.no_grad()`, on one intra-op thread: the host cost of the call, not of autograd. The clock is the CPU time of
the calling thread (`time.thread_time_ns`), not the wall clock: on a shared machine, time the thread spends waiting
for a core is no cost of the code under test.

The figures: per configuration and graph, microseconds per call above plain ThunderCompiler, and the fit
cost = per graph call + per split x splits through the 1- and 21-split graphs (target: at most 10 us per graph call
plus 2 us per split with defaults). Separate compiles of one graph differ by a few microseconds on their own (the
noise floor shows it), so the script also times the split runners alone on one compiled graph, with and without
them in place.

    python benchmarks/host_overhead.py [--rounds 31] [--calls 1000] [--instances 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
import torch

SPLIT_COUNTS = (1, 21)  # the second graph: ten sincs between eleven Thunder pieces
# "thunderfx again" is a second plain ThunderCompiler: its distance from the first is the noise floor.
CONFIGURATIONS = ("thunderfx", "thunderfx again", "timing off", "defaults")


class Chain(torch.nn.Module):
    """`sincs` torch.sinc calls between Thunder pieces: 2 * sincs splits (1 split without any)."""

    def __init__(self, sincs: int):
        super().__init__()
        self.sincs = sincs

    def forward(self, x):
        x = x * 2 + 1
        for _ in range(self.sincs):
            x = torch.sinc(x)
            x = x * 2 + 1
        return x


def backend(name: str):
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.thunder.compile import plain_thunder_compiler

    executors = [torch_compile_ex, *thunder.get_default_executors()]
    if name in ("thunderfx", "thunderfx again"):
        return plain_thunder_compiler(executors=executors)
    if name == "timing off":
        return ReportingBackend(timing="off", executors=executors)
    return ReportingBackend(executors=executors)  # the defaults: graph timing every 50 calls after 5


def compiled_functions(instances: int) -> dict[tuple[str, int, int], tuple[object, int]]:
    """(configuration, split count, instance) -> (compiled module, the splits ThunderFX made). Two compiles of the
    same graph by the same backend can differ by a few percent in host time (seen: 5 % at 21 splits), so each
    configuration gets several instances and its figure averages them."""
    functions = {}
    for splits in SPLIT_COUNTS:
        for instance in range(instances):
            for name in CONFIGURATIONS:
                compiler = backend(name)
                fn = torch.compile(Chain(splits // 2), backend=compiler, dynamic=False)
                with torch.no_grad():
                    fn(torch.ones(8))  # compiles
                info = compiler.subgraph_infos[-1]
                made = sum(1 for n in info.split_graph_module.graph.nodes if n.op == "call_module")
                functions[(name, splits, instance)] = (fn, made)
    return functions


def time_rounds(functions, rounds: int, calls: int, seed: int = 0) -> dict[tuple[str, int], list[float]]:
    """Microseconds per call of each configuration and split count, one figure per round (the mean over its
    instances); every round times every function once, in a shuffled order."""
    order = list(functions)
    rng = random.Random(seed)
    x = torch.ones(8)
    per_round: dict[tuple[str, int], list[float]] = {}
    with torch.no_grad():
        for _ in range(rounds):
            rng.shuffle(order)
            this_round: dict[tuple[str, int], list[float]] = {}
            for key in order:
                fn = functions[key][0]
                start = time.thread_time_ns()
                for _ in range(calls):
                    fn(x)
                this_round.setdefault(key[:2], []).append((time.thread_time_ns() - start) / calls / 1e3)
            for key, values in this_round.items():
                per_round.setdefault(key, []).append(statistics.fmean(values))
    return per_round


def runner_cost(rounds: int, calls: int, seed: int = 1) -> dict[str, float]:
    """The split runners alone, on the same compiled objects: a 21-split graph compiled by ReportingBackend (defaults)
    called with its runners in place and with its splits put back, interleaved. Free of the instance-to-instance
    differences of separate compiles, it isolates what the runners cost per split."""
    compiler = backend("defaults")
    fn = torch.compile(Chain(10), backend=compiler, dynamic=False)
    x = torch.ones(8)
    with torch.no_grad():
        fn(x)
    split_gm = compiler.recorder.graphs[-1].split_gm
    runners = {s.name: getattr(split_gm, s.name) for s in compiler.recorder.graphs[-1].splits}
    modes = {"with runners": runners, "without": {name: r.inner for name, r in runners.items()}}
    rng, per_call = random.Random(seed), {mode: [] for mode in modes}
    order = list(modes)
    with torch.no_grad():
        for _ in range(rounds):
            rng.shuffle(order)
            for mode in order:
                for name, module in modes[mode].items():
                    setattr(split_gm, name, module)
                start = time.thread_time_ns()
                for _ in range(calls):
                    split_gm(x)
                per_call[mode].append((time.thread_time_ns() - start) / calls / 1e3)
    for name, runner in runners.items():
        setattr(split_gm, name, runner)
    medians = {mode: statistics.median(values) for mode, values in per_call.items()}
    return {**{f"{mode} us": v for mode, v in medians.items()}, "splits": len(runners),
            "per_split_us": (medians["with runners"] - medians["without"]) / len(runners)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--calls", type=int, default=1000, help="calls per function and round (default 1000)")
    parser.add_argument("--instances", type=int, default=3,
                        help="compiled instances of each configuration and graph (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64  # every instance is a compile of the same frame
    functions = compiled_functions(args.instances)
    samples = time_rounds(functions, args.rounds, args.calls)
    median = {key: statistics.median(values) for key, values in samples.items()}
    made = {splits: functions[("thunderfx", splits, 0)][1] for splits in SPLIT_COUNTS}
    rows, fits = [], {}
    for name in CONFIGURATIONS:
        above = {splits: median[(name, splits)] - median[("thunderfx", splits)] for splits in SPLIT_COUNTS}
        low, high = SPLIT_COUNTS
        per_split = (above[high] - above[low]) / (made[high] - made[low])
        per_call = above[low] - per_split * made[low]
        fits[name] = {"per_graph_call_us": per_call, "per_split_us": per_split}
        for splits in SPLIT_COUNTS:
            rows.append((name, made[splits], median[(name, splits)], above[splits]))
    print(f"host time per call, median of {args.rounds} interleaved rounds of {args.calls} calls of each of "
          f"{args.instances} instances (perf_counter):")
    print(f"{'configuration':<14}{'splits':>7}{'us per call':>13}{'above plain':>13}")
    for name, splits, us, above in rows:
        print(f"{name:<14}{splits:>7}{us:>13.2f}{above:>13.2f}")
    for name in CONFIGURATIONS[1:]:
        fit = fits[name]
        print(f"{name}: {fit['per_graph_call_us']:.2f} us per graph call + {fit['per_split_us']:.2f} us per split "
              "above plain ThunderCompiler")
    alone = runner_cost(args.rounds, args.calls)
    print(f"the runners alone, same compiled graph of {alone['splits']} splits: {alone['with runners us']:.2f} us "
          f"per call with them, {alone['without us']:.2f} us without: {alone['per_split_us']:.2f} us per split")
    if args.json:
        figures = {
            "machine": platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
            "rounds": args.rounds, "calls": args.calls, "instances": args.instances, "clock": "host, CPU time of the calling thread (time.thread_time_ns)",
            "splits": made, "median_us_per_call": {f"{n} / {s} splits": v for (n, s), v in median.items()},
            "fit_above_plain": fits, "runners_alone": alone,
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
