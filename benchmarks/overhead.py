"""Step time of ReportingBackend against plain ThunderCompiler, in one process, and where the host time goes.

    source .gpu/setup.sh && python benchmarks/overhead.py --model llama --profile --json overhead_llama.json   # H200
    source .gpu/setup.sh && python benchmarks/overhead.py --model mixtral --profile --json overhead_mixtral.json
    OMP_NUM_THREADS=1 python benchmarks/overhead.py --device cpu --json overhead_cpu.json   # tiny Llama, host clock

Models (`--model`, a comma list, measured one after the other, the JSON rewritten after each):
  llama    Hugging Face LlamaForCausalLM. CUDA: 4 layers, hidden 1024, 16 heads (8 KV), intermediate 2816,
           vocabulary 32000, sequence 512, batch 4, bf16, Thunder's default executors (nvFuser). CPU: the harness's
           tiny size, float32, Thunder's torch.compile executor first (the one that fuses on CPU).
  mixtral  a Mixtral-style mixture of experts of the same size, 4 experts, 2 per token: many more splits.
Configurations (`--configurations`), each compiled on its own copy of the model (same initial weights, same batch,
AdamW):
  plain          thunderfx_debug.plain_thunder_compiler(lazy_inductor_fallback=True): the baseline
  plain again    a second plain one, compiled the same way: its ratio is the noise floor
  defaults       ReportingBackend(): graph timing every 50 calls after 5
  timing=fusion  ReportingBackend(timing="fusion", timing_every=50)
  check=fusion   ReportingBackend(check="fusion", check_every=50)
  dump           ReportingBackend(dump_dir=<a temporary directory>): the defaults as most runs use them, with the
                 periodic flush's trigger on every graph call (not in the default list; its flushes, every 600 s,
                 do not come within a run of this length)
`--every` changes the 50 of the two fusion configurations; `--check-share` is check=fusion's
THUNDERFX_DEBUG_CHECK_SHARE (default 100: every split on every scheduled call; the record then says how many
scheduled calls each split checked and passed over), `--timing-share` timing=fusion's THUNDERFX_DEBUG_TIMING_SHARE
(default 100: every sampled call timed; the record then says how many sampled calls each graph passed over). Both
are shares of the process's wall time, which the copies divide among them: with two copies, 0.5 is about 1 % of
the copy's own steps.

Method. The model's frames are compiled once first, for no configuration (`compile_frames_once`: the first compile
of a frame is slower to switch to). Each copy is compiled and warmed up (`--warmup` steps) one after the other.
Then rounds, each running a block of `--block` steps of every configuration in a shuffled order
(`harness.shuffled`), until `--rounds` or the deadline (`--deadline` seconds from the start, less what the profile
will need). Step boundaries are CUDA events, the device synchronised at the end of each block only; on CPU the
training thread's CPU time (`--step-clock`). A round's paired ratio is a configuration's block time over plain's in
that round. Figures per configuration: the median paired ratio with its bootstrap 95 % interval (the typical step:
a block holding a sampled or checked step is one of few), and the amortised ratio, the sum of its blocks over
plain's, with its bootstrap interval (sampled and checked steps count with their weight: choose rounds x block a
multiple of --every for a run's proportion of them); how many sampled and checked steps the measurement held;
Python's garbage collections per step.

Profile (`--profile`, after the measurement, on the same compiled copies): `--profile-rounds` rounds of
`--profile-block` steps of every configuration in a shuffled order, each step under cProfile (its own profile for
the steps that sample or check and for the others), then one torch.profiler session (CPU side) of
`--profile-block` unsampled steps per configuration. Per configuration, the host time per step of each part of the
training path (`path_parts.PARTS`: graph wrapper, split runners, instrumented trace marks, samplers, memory meter, input
capture, the check's bookkeeping, the periodic flush's trigger) on unsampled steps and on sampled ones, the
functions and torch.profiler events whose time per step differs most from plain's, and the whole profiled step.
cProfile costs about a microsecond per call it sees: a part's time is an upper bound, its calls per step exact.
On CPU its clock is the thread's CPU time (`--profile-clock`), so that waiting for a shared core is charged to no
function.

Checks: the first step's loss of every configuration against plain's, bit for bit (a difference is a FAILED line and
exit status 1 unless plain's second copy differs too: then the device is not deterministic here, and it is said);
every ReportingBackend graph ran once per warm-up step; a compile during the measurement (recompiles) is named.
THUNDERFX_DEBUG_* variables are cleared first: they would override the settings compared here.
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import path_parts  # noqa: E402

MODELS = ("llama", "mixtral")
CONFIGURATIONS = ("plain", "plain again", "defaults", "timing=fusion", "check=fusion", "dump")
DEFAULT_CONFIGURATIONS = CONFIGURATIONS[:5]
BASELINE = "plain"
TARGETS = {"defaults": 1.01, "timing=fusion": 1.02, "check=fusion": 1.02, "dump": 1.01}
#: The H200 size of the issue; CPU runs use the harness's tiny size.
CUDA_SIZE = harness.Size(layers=4, hidden=1024, heads=16, kv_heads=8, intermediate=2816, vocab=32000, seq=512,
                         batch=4)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="llama", help=f"comma list of {', '.join(MODELS)} (default llama)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: 4 on CUDA, 2 on CPU)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 on CUDA, 1 on CPU)")
    parser.add_argument("--configurations", default=",".join(DEFAULT_CONFIGURATIONS),
                        help=f"comma list of {', '.join(CONFIGURATIONS)} (plain is always in)")
    parser.add_argument("--rounds", type=int, default=400, help="rounds at most (default 400; the deadline may end "
                        "them sooner; 0: profile only)")
    parser.add_argument("--block", type=int, default=5, help="steps per configuration and round (default 5)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the measurement, the compile "
                        "included (default 10)")
    parser.add_argument("--every", type=int, default=50, help="timing_every / check_every of the fusion "
                        "configurations (default 50)")
    parser.add_argument("--check-share", type=float, default=100.0, help="check=fusion's check_share, percent of "
                        "the training's time (default 100: no limit)")
    parser.add_argument("--timing-share", type=float, default=100.0, help="timing=fusion's timing_share, percent "
                        "of the training's time (default 100: no limit)")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds from the start by which the run "
                        "ends its measurement and profile (default 480; compiles are not cut short)")
    parser.add_argument("--profile", action="store_true", help="also profile the host side (see below)")
    parser.add_argument("--profile-rounds", type=int, default=6, help="cProfile rounds (default 6)")
    parser.add_argument("--profile-block", type=int, default=10, help="steps per configuration and profile round, "
                        "and of the torch.profiler session (default 10)")
    parser.add_argument("--step-clock", choices=("wall", "cpu"), default="cpu", help="CPU runs: the step's host "
                        "clock, the wall clock or the CPU time of the training thread (default: cpu, which a core "
                        "shared with other work does not inflate; the whole step runs in that thread on CPU)")
    parser.add_argument("--profile-clock", choices=("wall", "cpu"), default=None, help="cProfile's clock: the wall "
                        "clock, or the CPU time of the thread (a core shared with other work then charges no "
                        "function for the time it waited; autograd's device thread on CUDA has a clock of its own). "
                        "Default: wall on CUDA, cpu on CPU")
    parser.add_argument("--executors", default=None, help="comma list of Thunder executor names (default: "
                        "Thunder's defaults on CUDA, the torch.compile executor first on CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the batch and the orders")
    parser.add_argument("--json", type=Path, default=None, help="write the record here (after each model)")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.profile_clock = args.profile_clock or ("wall" if args.device.startswith("cuda") else "cpu")
    args.models = [m.strip() for m in args.model.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        parser.error(f"--model {args.model!r}: a comma list of {', '.join(MODELS)}")
    chosen = [c.strip() for c in args.configurations.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONFIGURATIONS]
    if unknown:
        parser.error(f"--configurations: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGURATIONS)}")
    args.configurations = tuple(c for c in CONFIGURATIONS if c == BASELINE or c in chosen)
    if args.block < 1 or args.warmup < 1 or args.rounds < 0:
        parser.error("--block and --warmup must be at least 1, --rounds at least 0")
    if args.executors is not None:
        try:
            args.executors = tuple(e.name for e in harness.executors(args.device, args.executors))
        except SystemExit as error:
            parser.error(str(error))
    return args


def size_of(args) -> harness.Size:
    size = CUDA_SIZE if args.device.startswith("cuda") else harness.SIZES["tiny"]
    changes = {key: value for key, value in (("batch", args.batch), ("layers", args.layers)) if value is not None}
    return dataclasses.replace(size, **changes)


def clear_debug_environment() -> list[str]:
    cleared = sorted(name for name in os.environ if name.startswith("THUNDERFX_DEBUG_"))
    for name in cleared:
        del os.environ[name]
    return cleared


def make_backend(name: str, args, dump_dir: str):
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug import plain_thunder_compiler

    options = harness.thunder_options(args.device, args.executors)
    if name in ("plain", "plain again"):
        return plain_thunder_compiler(lazy_inductor_fallback=True, **options)
    if name == "defaults":
        return ReportingBackend(**options)
    if name == "timing=fusion":
        return ReportingBackend(timing="fusion", timing_every=args.every, timing_share=args.timing_share, **options)
    if name == "check=fusion":
        return ReportingBackend(check="fusion", check_every=args.every, check_share=args.check_share, **options)
    if name == "dump":
        return ReportingBackend(dump_dir=dump_dir, **options)
    raise ValueError(f"unknown configuration {name!r}")


# ---- which steps sample or check ---------------------------------------------------------------------------------

def special_steps(backend) -> Callable[[int], str]:
    """A function of a step's number (1-based, the graphs' call number: each graph runs once per step) that says
    whether a ReportingBackend samples or checks on it ("sampled", "checked", or "" for an ordinary step), as the
    backend itself says (`is_sampled`, `is_checked`)."""
    if not hasattr(backend, "is_sampled"):
        return lambda step: ""

    def kind(step: int) -> str:
        if backend.is_checked(step):
            return "checked"
        return "sampled" if backend.is_sampled(step) else ""

    return kind


# ---- one model ---------------------------------------------------------------------------------------------------

class Copy:
    """One configuration: its backend, its copy of the model, its trainer, what its warm-up and measurement saw."""

    def __init__(self, name: str, backend, model, batch: dict, step_clock):
        self.name, self.backend = name, backend
        self.trainer = harness.Trainer(model, backend, [batch], lr=1e-4, host_clock=step_clock)
        self.kind = special_steps(backend)
        self.losses: list[float] = []
        self.compile_s = self.step_ms = None
        self.blocks: list[list[float]] = []
        self.block_kinds: list[list[str]] = []
        self.gc = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}

    def graphs(self) -> int:
        return len(getattr(self.backend, "subgraph_infos", []))

    def warm_up(self, steps: int) -> None:
        clock = self.trainer.clock
        clock.sync()
        started = time.perf_counter()
        losses = [self.trainer.step()]
        clock.sync()
        self.compile_s = time.perf_counter() - started
        losses += [self.trainer.step() for _ in range(steps - 1)]
        self.step_ms = self.trainer.timed_step()[1]  # one more step, alone, to size the measurement
        self.losses = torch.stack(losses).float().cpu().tolist()

    def next_kinds(self, steps: int) -> list[str]:
        done = self.trainer.steps_done
        return [self.kind(done + i + 1) for i in range(steps)]

    def block(self, steps: int) -> list[float]:
        self.block_kinds.append(self.next_kinds(steps))
        times = self.trainer.block(steps)
        self.blocks.append(times)
        return times


class GcWatch:
    """Python's garbage collections during the measurement, counted and timed for the configuration running."""

    def __init__(self):
        self.current: Copy | None = None
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if self.current is None:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = info.get("generation", 0)
            self.current.gc["collections"][generation] += 1
            self.current.gc["seconds"][generation] += time.perf_counter() - self._started


def check_graphs_ran(copy_: Copy, warmup: int) -> None:
    """Each graph of a ReportingBackend ran once per warm-up step (no step went around it, none recompiled)."""
    report = getattr(copy_.backend, "report", None)
    if report is None:
        return
    calls = [g.calls for g in report().graphs]
    if not calls or any(c != warmup + 1 for c in calls):  # the warm-up steps and the one that sized the run
        raise RuntimeError(f"{copy_.name}: graph calls {calls} after {warmup + 1} steps: the steps did not all go "
                           "through its graphs once each, so the comparison would be meaningless")


def step_clock(args):
    """The host clock of CPU steps (see --step-clock); CUDA steps are timed with CUDA events."""
    return time.thread_time if args.step_clock == "cpu" else time.perf_counter


def compile_frames_once(base, batch: dict) -> None:
    """Compiles the model's frames once before the measured copies, with a backend that runs Dynamo's graphs as they
    are, on a copy trained one step and dropped. In a process that compiles several copies of one model, the first
    compile of a frame pays a cost on every switch from another copy that later compiles of it do not (seen on CPU:
    a pass-through backend's first copy 6 % slower than four later ones in shuffled blocks of 5 calls, none of
    them slower after such a first compile); without this, the baseline, compiled first, would carry it."""
    throwaway = copy.deepcopy(base)
    harness.Trainer(throwaway, lambda gm, example_inputs: gm.forward, [batch]).step()
    del throwaway


def build_copies(model_name: str, args, size: harness.Size, dump_dir: str, failed: dict) -> dict[str, Copy]:
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    base, batch = harness.build(model_name, size, args.device, dtype, seed=args.seed)
    compile_frames_once(base, batch)
    copies = {}
    for name in args.configurations:
        try:
            copy_ = Copy(name, make_backend(name, args, dump_dir), copy.deepcopy(base), batch, step_clock(args))
            copy_.warm_up(args.warmup)
            check_graphs_ran(copy_, args.warmup)
        except Exception:
            failed[name] = traceback.format_exc()
            print(f"  {name}: FAILED\n{failed[name]}", file=sys.stderr, flush=True)
            if name == BASELINE:
                break
            continue
        copies[name] = copy_
        print(f"  {name}: first step {copy_.compile_s:.1f} s, then {copy_.step_ms:.2f} ms a step, "
              f"{copy_.graphs()} graphs", flush=True)
    del base
    return copies


def measure(copies: dict[str, Copy], args, until: float, gc_watch: GcWatch, failed: dict[str, str]) -> int:
    """The rounds; a configuration whose step raises is dropped from `copies` with its traceback in `failed` (the
    baseline's ends the measurement). Returns the rounds every remaining configuration ran."""
    broken: set[str] = set()

    def block_of(name: str, copy_: Copy):
        def run():
            if name in broken:
                return None
            gc_watch.current = copy_
            try:
                return copy_.block(args.block)
            except Exception:
                failed[name] = traceback.format_exc()
                print(f"  {name}: FAILED during the measurement\n{failed[name]}", file=sys.stderr, flush=True)
                broken.add(name)
                return None
            finally:
                gc_watch.current = None
        return run

    gc.callbacks.append(gc_watch)
    try:
        harness.shuffled({name: block_of(name, c) for name, c in copies.items()}, args.rounds, seed=args.seed,
                         until=lambda: time.monotonic() >= until or BASELINE in broken)
    finally:
        gc.callbacks.remove(gc_watch)
    for name in broken:
        del copies[name]
    return len(copies[BASELINE].blocks) if BASELINE in copies else 0


def checked_and_passed_over(backend) -> dict | None:
    """Per Thunder split of a checking backend: [calls checked, scheduled calls passed over] (None: no check)."""
    report = getattr(backend, "report", None)
    if report is None:
        return None
    try:
        return {f"{g.name}/{s.name}": [s.check.calls, s.check.passed_over] for g in report().graphs
                for s in g.splits if s.check is not None} or None
    except Exception as error:  # a figure of the record, not of the measurement
        return {"error": repr(error)}


def check_costs() -> dict | None:
    """What the checks in this process were charged against THUNDERFX_DEBUG_CHECK_SHARE, summed over the splits
    (only check=fusion checks): the wall time of their own blocks, and what their checked calls' periods held beyond
    those (`check.CheckedCalls`, with a share below 100), in ms; None without a check."""
    import gc

    from internals import CheckTally

    turns = [o.turn for o in gc.get_objects() if type(o) is CheckTally and o.turn is not None]
    if not turns:
        return None
    return {"splits": len(turns), "blocks_ms": sum(t.blocks_total_ns for t in turns) / 1e6,
            "beyond_blocks_ms": sum(t.charged_total_ns for t in turns) / 1e6}


def timing_passed_over(backend) -> dict | None:
    """Per graph of a timing backend: [sampled calls timed, sampled calls passed over by its share] (None: none
    passed over)."""
    report = getattr(backend, "report", None)
    if report is None:
        return None
    try:
        return {g.name: [g.timing.count if g.timing else 0, g.timing_passed_over] for g in report().graphs
                if g.timing_passed_over} or None
    except Exception as error:  # a figure of the record, not of the measurement
        return {"error": repr(error)}


def device_holds() -> dict | None:
    """How fusion timing's device holds in this process sized their sleeps (`DeviceHold.sleeps`, summed over the
    graphs: only timing=fusion holds the device): {rule: [sleeps, ms asked for in all]}; None without a hold."""
    import gc

    from internals import DeviceHold

    holds = [o for o in gc.get_objects() if type(o) is DeviceHold]  # type(): no proxy dereferenced
    if not holds:
        return None
    return {rule: [sum(h.sleeps[rule][0] for h in holds), sum(h.sleeps[rule][1] for h in holds)]
            for rule in holds[0].sleeps}


def figures(copies: dict[str, Copy], rounds: int) -> dict:
    base = [sum(times) for times in copies[BASELINE].blocks]
    results = {}
    for name, c in copies.items():
        totals = [sum(times) for times in c.blocks]
        steps = [ms for times in c.blocks for ms in times]
        kinds = [k for block in c.block_kinds for k in block]
        entry = {"mean_step_ms": statistics.fmean(steps), "median_step_ms": statistics.median(steps),
                 "measured_steps": len(steps), "sampled_steps": kinds.count("sampled"),
                 "checked_steps": kinds.count("checked"), "compile_s": c.compile_s,
                 "graphs_after_warmup": c.graphs(), "gc_per_step": {
                     "collections": [n / len(steps) for n in c.gc["collections"]],
                     "ms": [s * 1e3 / len(steps) for s in c.gc["seconds"]]}}
        if name != BASELINE:
            ratios = [t / b for t, b in zip(totals, base)]
            median, low, high = harness.median_interval(ratios)
            amortised, a_low, a_high = harness.ratio_of_sums_interval(totals, base)
            ordinary = [r for r, block in zip(ratios, c.block_kinds) if not any(block)]
            entry.update(paired_ratio={"median": median, "low": low, "high": high},
                         amortised_ratio={"ratio": amortised, "low": a_low, "high": a_high},
                         ordinary_blocks_median_ratio=statistics.median(ordinary) if ordinary else None)
            if name in TARGETS:
                entry["target"] = TARGETS[name]
                entry["meets_target"] = amortised <= TARGETS[name]
        turns = checked_and_passed_over(c.backend)
        if turns:
            entry["split_checks"] = turns
        passed_over = timing_passed_over(c.backend)
        if passed_over:
            entry["timing_passed_over"] = passed_over
        entry["block_ms"] = totals  # per round, in round order: the paired ratios are these over plain's
        results[name] = entry
    return {"rounds": rounds, "configurations": results, "device_hold_sleeps": device_holds(),
            "check_costs": check_costs()}


# ---- profile ------------------------------------------------------------------------------------------------------

def profile(copies: dict[str, Copy], args) -> dict:
    """See the module docstring (Profile)."""
    def profiler():
        if args.profile_clock == "cpu":
            return cProfile.Profile(time.thread_time_ns, 1e-9)
        return cProfile.Profile()

    ordinary = {name: profiler() for name in copies}
    special = {name: profiler() for name in copies}
    counted = {name: {"ordinary": 0, "special": 0} for name in copies}

    def profiled_block(name: str):
        def run():
            c = copies[name]
            for kind in c.next_kinds(args.profile_block):
                profiler = special[name] if kind else ordinary[name]
                counted[name]["special" if kind else "ordinary"] += 1
                profiler.enable()
                c.trainer.step()
                profiler.disable()
            c.trainer.clock.sync()
        return run

    harness.shuffled({name: profiled_block(name) for name in copies}, args.profile_rounds, seed=args.seed + 1)
    classifier = path_parts.Classifier()
    functions = {name: path_parts.functions_per_step(ordinary[name], max(counted[name]["ordinary"], 1))
                 for name in copies}
    events = torch_profiler_pass(copies, args)
    result = {}
    for name in copies:
        steps = max(counted[name]["ordinary"], 1)
        entry = {"steps": counted[name],
                 "ordinary_step": path_parts.parts_per_step(ordinary[name], steps, classifier),
                 "ordinary_step_functions": path_parts.part_functions(ordinary[name], steps, classifier)}
        if counted[name]["special"]:
            entry["special_step"] = path_parts.parts_per_step(special[name], counted[name]["special"], classifier)
            entry["special_step_functions"] = path_parts.part_functions(special[name], counted[name]["special"],
                                                                        classifier)
        if name != BASELINE:
            entry["functions_against_plain"] = path_parts.differences(functions[name], functions[BASELINE])
            if events:
                entry["torch_profiler_against_plain"] = path_parts.event_differences(events[name], events[BASELINE])
        result[name] = entry
    return result


def torch_profiler_pass(copies: dict[str, Copy], args) -> dict | None:
    """Per configuration, torch.profiler's CPU-side events per step over `--profile-block` unsampled steps (fewer
    where a sampled or checked step comes sooner)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)  # the CUDA runtime's calls (cudaEventRecord, ...) on the host
    found = {}
    for name, c in copies.items():
        while c.next_kinds(1)[0]:  # a sampled or checked step next: run it unprofiled
            c.trainer.step()
        kinds = c.next_kinds(args.profile_block)
        steps = kinds.index(next(k for k in kinds if k)) if any(kinds) else len(kinds)  # up to the next one
        c.trainer.clock.sync()
        with torch_profile(activities=activities) as profiler:
            for _ in range(steps):
                c.trainer.step()
            c.trainer.clock.sync()
        found[name] = path_parts.torch_profiler_events(profiler, steps)
    return found


def profile_seconds(copies: dict[str, Copy], args) -> float:
    """What the profile will take, roughly: its steps at four times their speed, a start of torch.profiler per
    configuration (CUPTI's on CUDA takes seconds), and a margin."""
    if not args.profile:
        return 0.0
    steps = args.profile_block * (args.profile_rounds + 2)
    starts = len(copies) * (10 if args.device.startswith("cuda") else 1)
    return sum(c.step_ms for c in copies.values()) / 1e3 * steps * 4 + starts + 15


# ---- the run ------------------------------------------------------------------------------------------------------

def first_losses(copies: dict[str, Copy]) -> dict:
    """Whether each configuration's first loss equals plain's bit for bit, and whether plain is deterministic here."""
    base = copies[BASELINE].losses[0]
    same = {name: c.losses[0] == base for name, c in copies.items() if name != BASELINE}
    deterministic = same.get("plain again")
    changed = [name for name, equal in same.items() if not equal and name != "plain again"]
    return {"equal_to_plain": same, "plain_deterministic": deterministic,
            "changed_by_backend": changed if deterministic is not False else [],
            "losses": {name: c.losses for name, c in copies.items()}}


def run_model(model_name: str, args, started: float, save) -> dict:
    """One model's copies, measurement and profile; `save(result)` after the measurement too, so that a run stopped
    during its profile keeps its figures."""
    size = size_of(args)
    print(f"\n{model_name}: {size}, {args.device}, configurations {', '.join(args.configurations)}", flush=True)
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="overhead-dump-") as dump_dir:
        copies = build_copies(model_name, args, size, dump_dir, failed)
        if BASELINE not in copies:
            return {"size": dataclasses.asdict(size), "failed": failed, "error": "plain ThunderCompiler failed"}
        graphs_before = {name: c.graphs() for name, c in copies.items()}
        until = started + args.deadline - profile_seconds(copies, args)
        print(f"measuring up to {args.rounds} rounds of {args.block} steps per configuration, shuffled, until "
              f"{max(until - time.monotonic(), 0):.0f} s from now...", flush=True)
        gc_watch = GcWatch()
        rounds = measure(copies, args, until, gc_watch, failed) if args.rounds else 0
        if BASELINE not in copies:
            return {"size": dataclasses.asdict(size), "failed": failed, "error": "plain ThunderCompiler failed"}
        result = {"size": dataclasses.asdict(size), "failed": failed,
                  "splits": splits_of(copies), "first_losses": first_losses(copies)}
        if rounds:
            result["measurement"] = figures(copies, rounds)
        save(result)
        if args.profile:
            print("profiling...", flush=True)
            result["profile"] = profile(copies, args)
        result["recompiled_during_measurement"] = {
            name: c.graphs() - graphs_before[name] for name, c in copies.items() if c.graphs() != graphs_before[name]}
    return result


def splits_of(copies: dict[str, Copy]) -> dict:
    """Graphs and splits of the plain copy (every configuration splits alike)."""
    infos = copies[BASELINE].backend.subgraph_infos
    counts = [sum(1 for n in info.split_graph_module.graph.nodes if n.op == "call_module") for info in infos]
    return {"graphs": len(infos), "splits_per_graph": counts}


def print_model(name: str, data: dict) -> None:
    if "error" in data:
        print(f"{name}: {data['error']}")
        return
    print(f"\n{name}: {data['splits']['graphs']} graphs, splits per graph {data['splits']['splits_per_graph']}")
    measurement = data.get("measurement")
    if measurement:
        rows = measurement["configurations"]
        print(f"{measurement['rounds']} rounds; step (mean / median ms), paired ratio median [95 %], amortised "
              "ratio [95 %], sampled + checked steps measured, median ratio of the blocks without them")
        for config, r in rows.items():
            line = f"  {config:<14} {r['mean_step_ms']:9.3f} / {r['median_step_ms']:9.3f}"
            if "paired_ratio" in r:
                p, a = r["paired_ratio"], r["amortised_ratio"]
                line += (f"   {p['median']:.4f} [{p['low']:.4f}, {p['high']:.4f}]   {a['ratio']:.4f} "
                         f"[{a['low']:.4f}, {a['high']:.4f}]   {r['sampled_steps']} + {r['checked_steps']}")
                ordinary = r["ordinary_blocks_median_ratio"]
                line += f"   {ordinary:.4f}" if ordinary is not None else "   -"
                if "target" in r:
                    line += f"   target <= {r['target']}: {'met' if r['meets_target'] else 'MISSED'}"
                if "split_checks" in r:
                    line += f"   split checks [checked, passed over]: {r['split_checks']}"
                if "timing_passed_over" in r:
                    line += f"   sampled calls [timed, passed over]: {r['timing_passed_over']}"
            print(line)
        holds = measurement.get("device_hold_sleeps")
        if holds:
            print("device hold sleeps by rule [count, ms in all]: " + ", ".join(f"{k} {v[0]}, {v[1]:.1f}"
                                                                          for k, v in holds.items()))
        costs = measurement.get("check_costs")
        if costs:
            print(f"checks charged against the share ({costs['splits']} splits, the warm-up included): their blocks "
                  f"{costs['blocks_ms']:.1f} ms, beyond their blocks {costs['beyond_blocks_ms']:.1f} ms")
    profiled = data.get("profile")
    if profiled:
        print("host time per step by part of the path, cProfile (us per ordinary step, calls; per sampled or "
              "checked step)")
        parts = [p for p in (*path_parts.PARTS, path_parts.OTHER, "rest", "total")]
        for config, entry in profiled.items():
            print(f"  {config} ({entry['steps']['ordinary']} ordinary steps, {entry['steps']['special']} sampled "
                  "or checked)")
            for part in parts:
                o = entry["ordinary_step"][part]
                s = entry.get("special_step", {}).get(part)
                if part not in ("rest", "total") and not o["us"] and not (s and s["us"]):
                    continue
                text = f"    {part:<24} {o['us']:10.1f} us ({o['calls']:.0f} calls)"
                if s is not None:
                    text += f"   sampled/checked step {s['us']:10.1f} us ({s['calls']:.0f} calls)"
                print(text)
            for row in entry.get("functions_against_plain", [])[:8]:
                print(f"      {row['difference_us']:+9.1f} us  {row['function']} ({row['calls']:.1f} calls, "
                      f"plain {row['baseline_calls']:.1f})")
    losses = data["first_losses"]
    if losses["changed_by_backend"]:
        print(f"FAILED: the first loss of {', '.join(losses['changed_by_backend'])} differs from plain's",
              file=sys.stderr)
    elif losses["plain_deterministic"] is False:
        print("note: plain's two copies differ at the first loss: this device is not deterministic here, so losses "
              "say nothing about the backend")
    else:
        print("first losses equal plain's bit for bit")
    if data["recompiled_during_measurement"]:
        print(f"WARNING: compiled again during the measurement: {data['recompiled_during_measurement']}",
              file=sys.stderr)
    for config, detail in data["failed"].items():
        print(f"FAILED: {config}: {detail.strip().splitlines()[-1]}", file=sys.stderr)


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    cleared = clear_debug_environment()
    if cleared:
        print(f"note: cleared {', '.join(cleared)} (they would override the settings compared here)")
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # the host's work only, not MKL's choice of threads on a loaded machine
    torch._dynamo.config.cache_size_limit = 64  # one compile of each frame per configuration
    results = {"settings": {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()},
               "load_average_at_start": os.getloadavg(), "models": {}}
    ok = True
    for model_name in args.models:
        def save(data, model_name=model_name):
            results["models"][model_name] = data
            results["load_average_at_end"] = os.getloadavg()
            harness.write_record(args.json, "overhead", results, argv)

        data = run_model(model_name, args, started, save)
        save(data)
        print_model(model_name, data)
        ok = ok and "error" not in data and not data["failed"] and not data["first_losses"]["changed_by_backend"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
