"""Host cost per call of ReportingBackend's training path, against plain ThunderCompiler: on CUDA the path a training
step takes there, on CPU the CPU path.

Two graphs of tiny tensors (so the host's work is all there is): one that ThunderFX keeps in 1 split, and one it
cuts into 21 (eleven Thunder splits around ten `torch.sinc`s, which Thunder 0.2.6 sends to inductor). Each is compiled
under plain ThunderCompiler (twice: the second copy's distance from the first is the noise floor) and under each
ReportingBackend configuration, all in this one process. The configurations are timed in interleaved rounds (each
round times every configuration once, in a shuffled order, for `--calls` calls), so that drift of the machine hits
all of them alike, and each configuration's figure is its median over rounds of the mean time per call.

  CUDA  a training call: the forward on CUDA tensors that require a gradient, then its backward, with Thunder's
        default executors (nvFuser fuses the Thunder pieces): the wrappers, instrumented traces, CUDA events and
        streams that the backend installs on a real training step there, sampled and checked calls included at the
        rate the settings give them (every 50 calls). The clock is the wall clock (the backward's host work runs
        on autograd's device thread), with the device synchronised at the end of each round's calls.
  CPU   the forward under `torch.no_grad()`, with Thunder's torch.compile executor first: the host cost of the call,
        not of autograd. The clock is the CPU time of the calling thread (`time.thread_time_ns`): on a shared
        machine, time the thread spends waiting for a core is no cost of the code under test.
Both on one intra-op thread.

Configurations (`--configurations`, beside plain ThunderCompiler and its second copy):
  timing off          ReportingBackend(timing="off"): the runners and nothing else
  defaults            ReportingBackend(): graph timing every 50 calls after 5
  timing=fusion       ReportingBackend(timing="fusion", timing_every=50): marks in the traces on every call
  check=fusion        ReportingBackend(check="fusion", check_every=50): the sentinel's observers on every call
  dump                ReportingBackend(dump_dir=<temp dir>): the defaults with the periodic flush's trigger
  rank not recording  THUNDERFX_DEBUG_RANKS naming another rank: compiled as plain ThunderCompiler, the split
                      graph handed to Dynamo itself
(default: all on CUDA; timing off, defaults and rank not recording on CPU).

The figures: per configuration and graph, microseconds per call above plain ThunderCompiler, and the fit
cost = per graph call + per split x splits through the 1- and 21-split graphs (target: a few microseconds each).
Separate compiles of one graph differ by a few microseconds on their own (the noise floor shows it), so the script
also times the split runners alone on one compiled graph, with and without them in place. With `--predict
OVERHEAD_JSON` (a record of `benchmarks/overhead.py` from the same machine) it multiplies the fit by each model's
graphs and splits per step and sets the result beside the step time of plain ThunderCompiler there: the ratio
the host cost alone predicts, beside the one measured.

    python benchmarks/host_overhead.py [--rounds 31] [--calls 1000] [--instances 3] [--configurations LIST]
                                       [--predict OVERHEAD_JSON] [--json PATH]

The paired figure: each configuration's time over plain ThunderCompiler's in the same round, the median over
rounds; the second plain copy's ratio is its noise floor.

`--marks` measures instead what fusion-level timing's marks cost on calls that are not sampled (CPU): a 2-layer GPT
of tiny tensors under Thunder's default executors (which fuse nothing on CPU, so every op runs outside fusion
regions and gets a mark), trained with fusion timing that never samples (the marks are in the traces, unarmed)
against split timing (no marks in the traces), in interleaved rounds of `--steps` forward and backward passes (each
configuration compiled twice: the two copies' difference is the noise floor); the difference per step, and the
cost of one unarmed mark alone.

    python benchmarks/host_overhead.py --marks [--rounds 21] [--steps 50] [--json results/mark_cost_cpu.json]

`--runners` measures the runners alone, on an ordinary call, at a resolution no compiled graph gives on a shared
machine: a `GraphRunner` around a split graph of `SplitRunner`s around functions that return their argument (21 and
1 of them), never sampled, with and without the sentinel's schedule, against the same functions called without
runners (timeit, best of `--rounds`); nanoseconds per graph call and per split.

    python benchmarks/host_overhead.py --runners [--rounds 21] [--json results/runner_cost_cpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SPLIT_COUNTS = (1, 21)  # the second graph: ten sincs between eleven Thunder pieces
# "thunderfx again" is a second plain ThunderCompiler: its distance from the first is the noise floor.
# "rank not recording": THUNDERFX_DEBUG_RANKS names another rank, so this process (rank 0) compiles without records.
CONFIGURATIONS = ("thunderfx", "thunderfx again", "timing off", "defaults", "timing=fusion", "check=fusion", "dump",
                  "rank not recording")
CPU_CONFIGURATIONS = ("thunderfx", "thunderfx again", "timing off", "defaults", "rank not recording")
EVERY = 50  # timing_every and check_every of the fusion configurations: the defaults' rate


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


class Workload:
    """What one timed call is on a device, and its clock (see the module docstring): a training call on CUDA, a
    forward under no_grad on CPU."""

    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.options = harness.thunder_options(device)  # {} on CUDA: Thunder's defaults, nvFuser fusing
        self.clock = ("wall clock, the device synchronised at the end of each round's calls" if self.cuda
                      else "host, CPU time of the calling thread (time.thread_time_ns)")
        self._now = time.perf_counter_ns if self.cuda else time.thread_time_ns

    def input(self) -> torch.Tensor:
        return torch.ones(8, device=self.device, requires_grad=self.cuda)

    def call(self, fn, x):
        """One call as the workload makes it (compiles on its first run)."""
        if self.cuda:
            out = fn(x)
            # A compiled function returns its tensor, a split graph called directly the tuple of its outputs.
            (out[0] if isinstance(out, (tuple, list)) else out).sum().backward()
        else:
            fn(x)

    def per_call_us(self, fn, x, calls: int) -> float:
        """Microseconds per call of `calls` calls in a row."""
        call = self.call
        self.sync()
        start = self._now()
        for _ in range(calls):
            call(fn, x)
        self.sync()
        return (self._now() - start) / calls / 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def grad_mode(self):
        return contextlib.nullcontext() if self.cuda else torch.no_grad()


#: The backends that write a dump, closed before their directory is removed (else their flush at exit writes it again).
_DUMPING: list = []


def backend(name: str, workload: Workload, dump_dir: str):
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug import plain_thunder_compiler

    options = workload.options
    if name in ("thunderfx", "thunderfx again"):
        # inductor splits compiled on their first call, as ReportingBackend compiles them (lightning-thunder#2689):
        # the same callable in both on every call
        return plain_thunder_compiler(lazy_inductor_fallback=True, **options)
    if name == "timing off":
        return ReportingBackend(timing="off", **options)
    if name == "timing=fusion":
        return ReportingBackend(timing="fusion", timing_every=EVERY, **options)
    if name == "check=fusion":
        return ReportingBackend(check="fusion", check_every=EVERY, **options)
    if name == "dump":
        _DUMPING.append(ReportingBackend(dump_dir=dump_dir, **options))
        return _DUMPING[-1]
    if name == "rank not recording":
        return ReportingBackend(ranks=[1], **options)
    if name == "defaults":
        return ReportingBackend(**options)  # graph timing every 50 calls after 5
    raise ValueError(f"unknown configuration {name!r}")


def compiled_functions(instances: int, configurations: tuple[str, ...], workload: Workload, dump_dir: str,
                       seed: int = 0) -> dict[tuple[str, int, int], tuple[object, int]]:
    """(configuration, split count, instance) -> (compiled module, the splits ThunderFX made). Two compiles of the
    same graph by the same backend can differ by a few percent in host time (seen: 5 % at 21 splits), so each
    configuration gets several instances and its figure averages them."""
    functions = {}
    x = workload.input()
    # Chain's frame compiled once for no configuration: the first compile of a frame is slower to switch to (see
    # overhead.py's `compile_frames_once`); and each instance's configurations compiled in an order of their own.
    workload.call(torch.compile(Chain(0), backend=lambda gm, example_inputs: gm.forward, dynamic=False), x)
    rng = random.Random(seed)
    for splits in SPLIT_COUNTS:
        for instance in range(instances):
            for name in rng.sample(configurations, len(configurations)):
                compiler = backend(name, workload, dump_dir)
                fn = torch.compile(Chain(splits // 2), backend=compiler, dynamic=False)
                with workload.grad_mode():
                    workload.call(fn, x)  # compiles
                info = compiler.subgraph_infos[-1]
                made = sum(1 for n in info.split_graph_module.graph.nodes if n.op == "call_module")
                functions[(name, splits, instance)] = (fn, made)
    return functions


def time_rounds(functions, rounds: int, calls: int, workload: Workload,
                seed: int = 0) -> dict[tuple[str, int], list[float]]:
    """Microseconds per call of each configuration and split count, one figure per round (the mean over its
    instances); every round times every function once, in a shuffled order."""
    order = list(functions)
    rng = random.Random(seed)
    x = workload.input()
    per_round: dict[tuple[str, int], list[float]] = {}
    with workload.grad_mode():
        for _ in range(rounds):
            rng.shuffle(order)
            this_round: dict[tuple[str, int], list[float]] = {}
            for key in order:
                this_round.setdefault(key[:2], []).append(workload.per_call_us(functions[key][0], x, calls))
            for key, values in this_round.items():
                per_round.setdefault(key, []).append(statistics.fmean(values))
    return per_round


def runner_cost(rounds: int, calls: int, workload: Workload, dump_dir: str, seed: int = 1) -> dict[str, float]:
    """The split runners alone, on the same compiled objects: a 21-split graph compiled by ReportingBackend (defaults)
    called with its runners in place and with its splits put back, interleaved. Free of the instance-to-instance
    differences of separate compiles, it isolates what the runners cost per split."""
    compiler = backend("defaults", workload, dump_dir)
    fn = torch.compile(Chain(10), backend=compiler, dynamic=False)
    x = workload.input()
    with workload.grad_mode():
        workload.call(fn, x)
    from internals import put_splits, recorded_graphs

    graph = recorded_graphs(compiler)[-1]
    runners = {s.name: getattr(graph.split_gm, s.name) for s in graph.splits}
    modes = {"with runners": runners, "without": {name: r.inner for name, r in runners.items()}}
    rng, per_call = random.Random(seed), {mode: [] for mode in modes}
    order = list(modes)
    with workload.grad_mode():
        for _ in range(rounds):
            rng.shuffle(order)
            for mode in order:
                put_splits(graph, modes[mode])
                per_call[mode].append(workload.per_call_us(graph.split_gm, x, calls))
    put_splits(graph, runners)
    medians = {mode: statistics.median(values) for mode, values in per_call.items()}
    return {**{f"{mode} us": v for mode, v in medians.items()}, "splits": len(runners),
            "per_split_us": (medians["with runners"] - medians["without"]) / len(runners)}


def _marks_in(compiled_split) -> int:
    """The timing calls inserted into a split's last forward and backward traces."""
    import thunder

    traces = [thunder.last_traces(compiled_split)[-1]]
    backward = thunder.last_backward_traces(compiled_split)
    traces += [backward[-1]] if backward else []
    return sum(1 for t in traces for b in t.bound_symbols if b.sym.name.startswith("thunderfx_debug_"))


def unarmed_mark_ns(marks: int = 300, repeat: int = 2000) -> float:
    """Nanoseconds per unarmed op mark in a function that calls it `marks` times, as an instrumented trace does,
    against the same function without the calls (best of 7)."""
    import timeit

    from internals import HostClock, RegionTimer

    mark = RegionTimer(HostClock(), series={}).mark_op
    body = "\n".join("    mark('linear', 'torch')" for _ in range(marks))
    namespace = {"mark": mark}
    exec(f"def with_marks():\n{body}\n\ndef without():\n    pass\n", namespace)
    with_marks = min(timeit.repeat(namespace["with_marks"], number=repeat, repeat=7))
    without = min(timeit.repeat(namespace["without"], number=repeat, repeat=7))
    return (with_marks - without) / repeat / marks * 1e9


def marks_cost(rounds: int, steps: int, seed: int = 0) -> dict:
    """See the module docstring (`--marks`). Each configuration is compiled twice and the four are interleaved: the
    difference between two copies of one configuration is the noise floor of the comparison."""
    import copy

    from internals import recorded_graphs

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import GPT, GPTConfig, synthetic_batches

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, graph_break=False, sinc_gate=False)
    base = GPT(config)
    tokens, targets = next(synthetic_batches(config, batch_size=4, device="cpu"))
    runs = {}
    for copy_index in (1, 2):
        for name, timing in (("split timing, no marks", "split"), ("fusion timing, unarmed marks", "fusion")):
            torch._dynamo.reset()
            model = copy.deepcopy(base)
            backend = ReportingBackend(timing=timing, timing_warmup=10**9)  # never sampled: the marks stay unarmed
            fn = torch.compile(model, backend=backend)
            fn(tokens, targets).backward()  # compiles
            marks = sum(_marks_in(s.split.compiled) for g in recorded_graphs(backend) for s in g.splits
                        if s.split.kind.value == "thunder")
            runs[(name, copy_index)] = (model, fn, marks)
    order, rng = list(runs), random.Random(seed)
    per_step: dict[tuple[str, int], list[float]] = {key: [] for key in order}
    for _ in range(rounds):
        rng.shuffle(order)
        for key in order:
            model, fn, _ = runs[key]
            start = time.perf_counter_ns()
            for _ in range(steps):
                fn(tokens, targets).backward()
            per_step[key].append((time.perf_counter_ns() - start) / steps / 1e3)
            for p in model.parameters():
                p.grad = None
    median = {f"{name} ({i})": statistics.median(values) for (name, i), values in per_step.items()}

    def both(name):
        return statistics.median(per_step[(name, 1)] + per_step[(name, 2)])

    marks = runs[("fusion timing, unarmed marks", 1)][2]
    extra = both("fusion timing, unarmed marks") - both("split timing, no marks")
    floor = max(abs(statistics.median(per_step[(n, 1)]) - statistics.median(per_step[(n, 2)]))
                for n in ("split timing, no marks", "fusion timing, unarmed marks"))
    return {"median_us_per_step": median, "marks_per_step": marks, "us_per_step_for_marks": extra,
            "noise_floor_us": floor, "unarmed_mark_ns": unarmed_mark_ns(), "rounds": rounds, "steps": steps}


def runners_alone(rounds: int, calls: int = 20_000) -> dict:
    """See the module docstring (`--runners`)."""
    import timeit
    from types import SimpleNamespace

    from internals import CheckSchedule, GraphRunner, Sampling, SplitRunner, TimingBesideChecks, host_series

    class Unsampled:
        """Stands for the graph's sampler; the schedules below never pick a call."""

        def run(self, fn, args, call):
            return fn(*args)

    class Unchecked:
        """Stands for a split's check: it checks the first call (and nothing), the next never comes."""

        def __init__(self, schedule):
            self.schedule = schedule

        def before(self, call, args):
            return None

        def after(self, checked, args, out):
            pass

    def identity(x):
        return x

    def graph(splits: int, checked: bool):
        sampling = Sampling(every=50, warmup=10**9)  # timed, never within the measurement
        schedule = CheckSchedule(every=10**9) if checked else None
        if schedule is not None:
            sampling = TimingBesideChecks(sampling, schedule)
        state = SimpleNamespace(calls=0, name="graph0", failed_split=None, period=host_series())
        runners = []
        for index in range(splits):
            split = SimpleNamespace(calls=0, name=f"thunder_{index}", error=None)
            runner = SplitRunner(identity, split, state, sampling, Unsampled(), capture=None)
            if schedule is not None:
                runner.check = Unchecked(schedule)
            runners.append(runner)

        def split_graph(x):
            for runner in runners:
                x = runner(x)
            return x

        wrapped = GraphRunner(state, split_graph, sampling, Unsampled(), None, on_error=None)
        wrapped(0)  # the first call
        return wrapped

    def bare(splits: int):
        functions = [identity] * splits

        def split_graph(x):
            for function in functions:
                x = function(x)
            return x

        return split_graph

    low, high = SPLIT_COUNTS
    figures = {}
    for checked in (False, True):
        ns = {}
        for splits in SPLIT_COUNTS:
            with_runners, without = graph(splits, checked), bare(splits)
            ns[splits] = (min(timeit.repeat(lambda: with_runners(1), number=calls, repeat=rounds))
                          - min(timeit.repeat(lambda: without(1), number=calls, repeat=rounds))) / calls * 1e9
        per_split = (ns[high] - ns[low]) / (high - low)
        figures["with the sentinel's schedule" if checked else "timed"] = {
            "ns_above_bare": ns, "per_graph_call_ns": ns[low] - per_split * low, "per_split_ns": per_split}
    return {"rounds": rounds, "calls": calls, "clock": "timeit (wall clock, best of the rounds)", "runners": figures}


def print_runners(figures: dict) -> None:
    for name, row in figures["runners"].items():
        print(f"runners, {name}: {row['per_graph_call_ns']:.0f} ns per graph call + {row['per_split_ns']:.0f} ns per "
              f"split on an ordinary call (1 split {row['ns_above_bare'][1]:.0f} ns, 21 splits "
              f"{row['ns_above_bare'][21]:.0f} ns above the bare functions)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 31; --marks 21)")
    parser.add_argument("--calls", type=int, default=1000, help="calls per function and round (default 1000)")
    parser.add_argument("--instances", type=int, default=3,
                        help="compiled instances of each configuration and graph (default 3)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--marks", action="store_true", help="the cost of fusion timing's unarmed marks instead")
    parser.add_argument("--runners", action="store_true", help="the runners alone on an ordinary call instead")
    parser.add_argument("--steps", type=int, default=50, help="--marks: steps per configuration and round (default 50)")
    parser.add_argument("--configurations", metavar="LIST",
                        help="a comma list of the configurations to time beside plain ThunderCompiler and its second "
                             f"copy, of {', '.join(CONFIGURATIONS[2:])} (default: all on CUDA, "
                             f"{', '.join(CPU_CONFIGURATIONS[2:])} on CPU)")
    parser.add_argument("--predict", metavar="OVERHEAD_JSON", type=Path,
                        help="a record of benchmarks/overhead.py: the step ratio each model's graphs and splits "
                             "predict from this host cost")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (21 if args.marks else 31)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.configurations_chosen = CONFIGURATIONS if args.device.startswith("cuda") else CPU_CONFIGURATIONS
    if args.configurations:
        chosen = [c.strip() for c in args.configurations.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in CONFIGURATIONS[2:]]
        if unknown or not chosen:
            parser.error(f"--configurations {args.configurations!r}: a comma list of {', '.join(CONFIGURATIONS[2:])}")
        args.configurations_chosen = (*CONFIGURATIONS[:2], *chosen)
    if args.predict is not None and not args.predict.is_file():
        parser.error(f"--predict {args.predict}: no such file")
    return args


def print_marks(figures: dict) -> None:
    for name, us in figures["median_us_per_step"].items():
        print(f"{name:<34} {us:10.1f} us per step (forward and backward, median of {figures['rounds']} rounds)")
    print(f"{figures['marks_per_step']} marks per step: {figures['us_per_step_for_marks']:+.1f} us per step "
          f"(two copies of one configuration differ by up to {figures['noise_floor_us']:.1f} us); one unarmed "
          f"mark alone: {figures['unarmed_mark_ns']:.0f} ns, "
          f"{figures['marks_per_step'] * figures['unarmed_mark_ns'] / 1e3:.1f} us per step")


def host_cost(configurations: tuple[str, ...], rounds: int, calls: int, instances: int, workload: Workload) -> dict:
    """Per configuration and graph, the median over rounds of the host time per call; the fit through both graphs
    above plain ThunderCompiler; the paired ratios to plain ThunderCompiler; and the split runners alone."""
    # every instance is a compile of the same frame, and so are the one for no configuration and the runners' own
    torch._dynamo.config.cache_size_limit = max(64, instances * len(configurations) * len(SPLIT_COUNTS) + 2)
    dump_dir = tempfile.mkdtemp(prefix="host-overhead-dump-")
    try:
        functions = compiled_functions(instances, configurations, workload, dump_dir)
        samples = time_rounds(functions, rounds, calls, workload)
        alone = runner_cost(rounds, calls, workload, dump_dir)
    finally:
        while _DUMPING:
            _DUMPING.pop().close()
        shutil.rmtree(dump_dir, ignore_errors=True)
    median = {key: statistics.median(values) for key, values in samples.items()}
    made = {splits: functions[("thunderfx", splits, 0)][1] for splits in SPLIT_COUNTS}
    low, high = SPLIT_COUNTS
    fits = {}
    for name in configurations:
        above = {splits: median[(name, splits)] - median[("thunderfx", splits)] for splits in SPLIT_COUNTS}
        per_split = (above[high] - above[low]) / (made[high] - made[low])
        fits[name] = {"per_graph_call_us": above[low] - per_split * made[low], "per_split_us": per_split}
    ratios = {}
    for splits in SPLIT_COUNTS:
        paired = harness.paired_ratios({name: samples[(name, splits)] for name in configurations}, "thunderfx")
        ratios.update({f"{name} / {splits} splits": r["median"] for name, r in paired.items()})
    return {"device": workload.device, "rounds": rounds, "calls": calls, "instances": instances,
            "call": "forward and backward" if workload.cuda else "forward under no_grad",
            "clock": workload.clock, "splits": made,
            "median_us_per_call": {f"{n} / {s} splits": v for (n, s), v in median.items()},
            "fit_above_plain": fits, "paired_ratio_to_plain": ratios, "runners_alone": alone}


def predict(figures: dict, overhead_record: dict) -> dict:
    """Per model of an overhead.py record and configuration of this run: the host time per step that the fit gives
    for the model's graphs and splits (each graph and split called once per step), and the ratio to plain
    ThunderCompiler's mean step that it predicts, beside the amortised ratio measured there."""
    predicted = {}
    for model, data in overhead_record["results"].get("models", {}).items():
        measurement = data.get("measurement")
        if not measurement or "splits" not in data:
            continue
        graphs, splits = data["splits"]["graphs"], sum(data["splits"]["splits_per_graph"])
        configurations = measurement["configurations"]
        step_us = configurations["plain"]["mean_step_ms"] * 1e3
        rows = {}
        for name, fit in figures["fit_above_plain"].items():
            if name == "thunderfx":
                continue
            extra_us = fit["per_graph_call_us"] * graphs + fit["per_split_us"] * splits
            measured = configurations.get(_OVERHEAD_NAMES.get(name, name), {}).get("amortised_ratio", {})
            rows[name] = {"host_us_per_step": extra_us, "predicted_ratio": 1 + extra_us / step_us,
                          "measured_ratio": measured.get("ratio"),
                          "measured_interval": [measured.get("low"), measured.get("high")] if measured else None}
        predicted[model] = {"graphs": graphs, "splits": splits, "plain_step_ms": step_us / 1e3,
                            "configurations": rows}
    return predicted


#: This script's configuration names as benchmarks/overhead.py calls them.
_OVERHEAD_NAMES = {"thunderfx again": "plain again"}


def print_host_cost(figures: dict) -> None:
    print(f"host time per call ({figures['call']} on {figures['device']}), median of {figures['rounds']} "
          f"interleaved rounds of {figures['calls']} calls of each of {figures['instances']} instances "
          f"({figures['clock']}):")
    print(f"{'configuration':<20}{'splits':>7}{'us per call':>13}{'above plain':>13}")
    for name in figures["fit_above_plain"]:
        for count, splits in figures["splits"].items():
            us = figures["median_us_per_call"][f"{name} / {count} splits"]
            plain = figures["median_us_per_call"][f"thunderfx / {count} splits"]
            print(f"{name:<20}{splits:>7}{us:>13.2f}{us - plain:>13.2f}")
    for name, fit in list(figures["fit_above_plain"].items())[1:]:
        print(f"{name}: {fit['per_graph_call_us']:.2f} us per graph call + {fit['per_split_us']:.2f} us per split "
              "above plain ThunderCompiler")
    print("paired ratio to plain ThunderCompiler (median over rounds of each round's ratio): "
          + ", ".join(f"{key} {ratio:.4f}" for key, ratio in figures["paired_ratio_to_plain"].items()))
    alone = figures["runners_alone"]
    print(f"the runners alone, same compiled graph of {alone['splits']} splits: {alone['with runners us']:.2f} us "
          f"per call with them, {alone['without us']:.2f} us without: {alone['per_split_us']:.2f} us per split")
    for model, prediction in figures.get("predicted", {}).items():
        print(f"{model} ({prediction['graphs']} graphs, {prediction['splits']} splits, plain step "
              f"{prediction['plain_step_ms']:.2f} ms): ratio predicted by the host cost / measured")
        for name, row in prediction["configurations"].items():
            measured = "not measured" if row["measured_ratio"] is None else f"{row['measured_ratio']:.4f}"
            print(f"  {name:<20} {row['host_us_per_step']:8.1f} us a step: {row['predicted_ratio']:.4f} / {measured}")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.marks:
        figures = marks_cost(args.rounds, args.steps)
        print_marks(figures)
    elif args.runners:
        figures = runners_alone(args.rounds)
        print_runners(figures)
    else:
        figures = host_cost(args.configurations_chosen, args.rounds, args.calls, args.instances, Workload(args.device))
        if args.predict is not None:
            figures["predicted"] = predict(figures, json.loads(args.predict.read_text()))
        print_host_cost(figures)
    harness.write_record(args.json, "host_overhead", figures, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
