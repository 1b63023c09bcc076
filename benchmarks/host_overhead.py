"""Host cost per call of ReportingBackend's training path, against plain ThunderCompiler, on CPU.

Two graphs of tiny tensors (so the host's work is all there is): one that ThunderFX keeps in 1 split, and one it
cuts into 21 (eleven Thunder splits around ten `torch.sinc`s, which Thunder 0.2.6 sends to inductor). Each is compiled
under plain ThunderCompiler and under ReportingBackend with timing off and with its defaults (graph timing every 50
calls after 5), all in this one process. The configurations are timed in interleaved rounds (each round times every
configuration once, in a shuffled order, for `--calls` calls), so that drift of the machine hits all of them alike,
and each configuration's figure is its median over rounds of the mean time per call. The forward runs under
`torch.no_grad()`: the host cost of the call, not of autograd.

The figures: per configuration and graph, microseconds per call above plain ThunderCompiler, and the fit
cost = per graph call + per split x splits through the 1- and 21-split graphs (target, issue #14: at most 10 us per
graph call plus 2 us per split with defaults).

    python benchmarks/host_overhead.py [--rounds 31] [--calls 2000] [--json results/host_overhead_cpu.json]
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
CONFIGURATIONS = ("thunderfx", "timing off", "defaults")


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
    if name == "thunderfx":
        return plain_thunder_compiler(executors=executors)
    if name == "timing off":
        return ReportingBackend(timing="off", executors=executors)
    return ReportingBackend(executors=executors)  # the defaults: graph timing every 50 calls after 5


def compiled_functions() -> dict[tuple[str, int], tuple[object, int]]:
    """(configuration, split count) -> (compiled module, the splits ThunderFX made)."""
    functions = {}
    for splits in SPLIT_COUNTS:
        for name in CONFIGURATIONS:
            torch._dynamo.reset()
            compiler = backend(name)
            fn = torch.compile(Chain(splits // 2), backend=compiler)
            with torch.no_grad():
                fn(torch.ones(8))  # compiles
            info = compiler.subgraph_infos[-1]
            made = sum(1 for n in info.split_graph_module.graph.nodes if n.op == "call_module")
            functions[(name, splits)] = (fn, made)
    return functions


def time_rounds(functions, rounds: int, calls: int, seed: int = 0) -> dict[tuple[str, int], list[float]]:
    """Microseconds per call of each function, one figure per round; rounds interleave the functions."""
    order = list(functions)
    rng = random.Random(seed)
    x = torch.ones(8)
    per_call: dict[tuple[str, int], list[float]] = {key: [] for key in order}
    with torch.no_grad():
        for _ in range(rounds):
            rng.shuffle(order)
            for key in order:
                fn = functions[key][0]
                start = time.perf_counter_ns()
                for _ in range(calls):
                    fn(x)
                per_call[key].append((time.perf_counter_ns() - start) / calls / 1e3)
    return per_call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per configuration and round (default 2000)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    functions = compiled_functions()
    samples = time_rounds(functions, args.rounds, args.calls)
    median = {key: statistics.median(values) for key, values in samples.items()}
    made = {splits: functions[("thunderfx", splits)][1] for splits in SPLIT_COUNTS}
    rows, fits = [], {}
    for name in CONFIGURATIONS:
        above = {splits: median[(name, splits)] - median[("thunderfx", splits)] for splits in SPLIT_COUNTS}
        low, high = SPLIT_COUNTS
        per_split = (above[high] - above[low]) / (made[high] - made[low])
        per_call = above[low] - per_split * made[low]
        fits[name] = {"per_graph_call_us": per_call, "per_split_us": per_split}
        for splits in SPLIT_COUNTS:
            rows.append((name, made[splits], median[(name, splits)], above[splits]))
    print(f"host time per call, median of {args.rounds} interleaved rounds of {args.calls} calls (perf_counter):")
    print(f"{'configuration':<14}{'splits':>7}{'us per call':>13}{'above plain':>13}")
    for name, splits, us, above in rows:
        print(f"{name:<14}{splits:>7}{us:>13.2f}{above:>13.2f}")
    for name in CONFIGURATIONS[1:]:
        fit = fits[name]
        print(f"{name}: {fit['per_graph_call_us']:.2f} us per graph call + {fit['per_split_us']:.2f} us per split "
              "above plain ThunderCompiler")
    if args.json:
        figures = {
            "machine": platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
            "rounds": args.rounds, "calls": args.calls, "clock": "host perf_counter",
            "splits": made, "median_us_per_call": {f"{n} / {s} splits": v for (n, s), v in median.items()},
            "fit_above_plain": fits,
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
