"""The device memory each feature costs, against plain ThunderCompiler, and a memory-tight run with every feature on.

    source .gpu/setup.sh && python benchmarks/device_memory.py features --models llama,mixtral --json $OUT/devmem.json
    source .gpu/setup.sh && python benchmarks/device_memory.py tight --model llama --steps 40 --json $OUT/tight.json
    python benchmarks/device_memory.py features --device cpu --size tiny --models llama --steps 3   # smoke test

`features`: per model (a zoo model, `harness.py`; realistic size, bfloat16, Thunder's default executors with
nvFuser), each configuration trains `--steps` steps in a process of its own, one after another: plain
ThunderCompiler, ReportingBackend at its defaults, TIMING=fusion, CHECK=fusion, TRIAGE=split with the children
compiling ahead during training (THUNDERFX_DEBUG_DEVICE_MARGIN=0) and at the flush only (=100), and every feature on
(`EVERY_FEATURE`), `--parallel` of them at once. Each process reports its allocator's peak reserved memory
(`torch.cuda.max_memory_reserved`, the training's own process). Meanwhile this process reads what each process holds
on the device (`nvidia-smi`, every `POLL_S`): the training process (its CUDA context included) and its descendants,
the tool's children (their contexts and allocations), the most of each during training and during the flush.

`tight`: the memory-tight run of docs/memory.md. Plain ThunderCompiler first trains the model to learn its footprint
(the allocator's peak reserved, plus what the device's used memory grew by outside the allocator: nvFuser's kernels,
libraries). Then plain, and every feature on, each train `--steps` steps under deterministic algorithms in a process
whose free device memory a ballast tensor cuts to that footprint plus `--headroom-gib`; at step `--late-step` the
loop allocates a buffer of `--late-fraction` of the headroom and keeps it through that step (an evaluation pass, a
longer batch, a checkpoint's staging copy do). Each says how many steps it did, its losses and a hash of its
parameters (bit-equal to plain's, or not), and every feature's run how its flush judged each Thunder split (judged,
or why not).

`--repeat N` runs each configuration in N processes (a fault that comes at random, counted over several); a
training that raises records its step and the exception's message (the flush still runs, as at a user's exit).

`--configurations check=fusion+pools` runs CHECK=fusion with the allocator's history recorded (Python stacks) and
lists, at the end of training, what lies in the allocator's pools other than the training's and where in the Python
code the blocks still in use there were allocated (`other_pools` in the record).

The record (`--json`) holds every figure in bytes; the printed table in GiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

#: Seconds between two readings of the device's used memory.
POLL_S = 0.2
#: What `features` runs: configuration -> THUNDERFX_DEBUG_* settings (None: plain ThunderCompiler).
CONFIGURATIONS = {
    "plain": None,
    "defaults": {},
    "timing=fusion": {"TIMING": "fusion", "TIMING_EVERY": "5"},
    "check=fusion": {"CHECK": "fusion", "CHECK_EVERY": "5"},
    "triage=split ahead": {"TRIAGE": "split", "DEVICE_MARGIN": "0"},
    "triage=split at flush": {"TRIAGE": "split", "DEVICE_MARGIN": "100"},
    "every feature": None,  # EVERY_FEATURE
    # CHECK=fusion, and what lies in the allocator's pools other than the training's at the end, with where in the
    # Python code each block still in use there was allocated (the allocator's history, with stacks)
    "check=fusion+pools": {"CHECK": "fusion", "CHECK_EVERY": "5"},
}
#: Every feature on, as a user who switched everything on (tests/test_exactness.py's, zoo.py's --every-feature).
EVERY_FEATURE = {"TIMING": "fusion", "TIMING_EVERY": "5", "CHECK": "fusion", "CHECK_EVERY": "5", "TRIAGE": "split",
                 "MINIMIZE": "1", "REPRO": "all"}
GiB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("what", choices=("features", "tight"))
    parser.add_argument("--models", default="llama,mixtral", help="features: comma list of zoo models")
    parser.add_argument("--model", default="llama", choices=harness.MODELS, help="tight: the zoo model")
    parser.add_argument("--size", default=None, choices=sorted(harness.SIZES),
                        help="zoo size (default: realistic on CUDA, tiny on CPU)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=None, help="steps per configuration (features 12, tight 40)")
    parser.add_argument("--configurations", default=",".join(c for c in CONFIGURATIONS if not c.endswith("+pools")),
                        help=f"features: comma list of {', '.join(CONFIGURATIONS)} (default: all but the last)")
    parser.add_argument("--headroom-gib", type=float, default=3.0, help="tight: free memory beyond plain's footprint")
    parser.add_argument("--late-step", type=int, default=None, help="tight: the step that allocates the buffer "
                        "(default: 5 before the end)")
    parser.add_argument("--late-fraction", type=float, default=0.8, help="tight: the buffer, a share of the headroom")
    parser.add_argument("--dump", default=None, help="dump directories go under here (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per configuration's process")
    parser.add_argument("--repeat", type=int, default=1, help="features: processes per configuration (a fault that "
                        "comes at random, counted over several)")
    parser.add_argument("--parallel", type=int, default=1, help="features: configurations run at once (each process's "
                        "figures are its own: nvidia-smi names the processes)")
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a configuration's process: its JSON as settings
    args = parser.parse_args(argv)
    args.size = args.size or ("realistic" if args.device == "cuda" else "tiny")
    args.steps = args.steps or (12 if args.what == "features" else 40)
    args.late_step = args.steps - 5 if args.late_step is None else args.late_step
    return args


# ---- a configuration's process --------------------------------------------------------------------------------------
def child(spec: dict) -> dict:
    """Trains one configuration as `spec` says and returns its figures (see the module docstring)."""
    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on this torch)
    import torch

    cuda = spec["device"] == "cuda"
    if spec.get("deterministic"):
        torch.use_deterministic_algorithms(True)
    figures: dict = {"config": spec["config"], "pid": os.getpid()}
    ballast = None
    if cuda:
        torch.zeros(1, device="cuda")  # the context
        if spec.get("free_bytes") is not None:
            free, _ = torch.cuda.mem_get_info()
            before = torch.cuda.memory_reserved()
            ballast = torch.empty(max(0, free - spec["free_bytes"]), dtype=torch.uint8, device="cuda")
            figures["ballast_bytes"] = torch.cuda.memory_reserved() - before
            figures["free_after_ballast"] = torch.cuda.mem_get_info()[0]
        figures["used_before_model"] = _device_used_here()
    pools = cuda and spec["config"].endswith("+pools")
    if pools:
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    model, batch = harness.build(spec["model"], spec["size"], spec["device"], "bfloat16" if cuda else "float32")
    options = harness.thunder_options(spec["device"])
    if spec["settings"] is None:
        backend = thunderfx_debug.plain_thunder_compiler(lazy_inductor_fallback=True, **options)
    else:
        backend = thunderfx_debug.ReportingBackend(**options)  # the settings come from THUNDERFX_DEBUG_*
    trainer = harness.Trainer(model, backend, [batch])
    Path(spec["phase_file"]).write_text("training")
    losses, late = [], spec.get("late_bytes", 0)
    try:
        for step in range(spec["steps"]):
            buffer = torch.ones(late, dtype=torch.uint8, device="cuda") if late and step == spec["late_step"] else None
            losses.append(trainer.step())
            del buffer
    except torch.OutOfMemoryError as e:
        figures["error"] = f"OutOfMemoryError at step {len(losses)}: {str(e).splitlines()[0][:300]}"
    except Exception as e:  # noqa: BLE001  (a failure of the run's compile: recorded with its step, then the flush)
        figures["error"] = f"{type(e).__name__} at step {len(losses)}: {_what_failed(e)}"
        figures["processes_of_the_tool_at_failure"] = len(_descendants(os.getpid()))
    figures["steps_done"] = len(losses)
    figures["losses"] = [float(x) for x in losses]
    figures["parameters_sha256"] = hashlib.sha256(b"".join(
        p.detach().float().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    if cuda:
        figures["peak_reserved"] = torch.cuda.max_memory_reserved() - figures.get("ballast_bytes", 0)
        figures["reserved_end"] = torch.cuda.memory_reserved() - figures.get("ballast_bytes", 0)
        figures["used_after_training"] = _device_used_here()
    if pools:
        figures["other_pools"] = _other_pools()
    Path(spec["phase_file"]).write_text("flush")
    if spec["settings"] is not None:
        started = time.perf_counter()
        rank_dir = backend.close()
        figures["flush_s"] = round(time.perf_counter() - started, 1)
        figures["splits"] = _splits(thunderfx_debug.load_report(rank_dir)) if rank_dir is not None else []
    Path(spec["phase_file"]).write_text("done")
    del ballast
    return figures


def _what_failed(error: BaseException) -> str:
    """An exception's message without the C++ frames nvFuser appends (its first lines name the assert)."""
    lines = [line for line in str(error).splitlines() if not line.startswith(("frame #", "Exception raised from"))]
    return "\n".join(lines)[:1500]


def _other_pools(top: int = 12) -> dict:
    """What the allocator holds outside its default pool: segments and bytes per pool, and the places in the Python
    code that allocated the blocks still in use there, the largest first."""
    import collections

    import torch

    snapshot = torch.cuda.memory._snapshot()
    per_pool: dict = collections.defaultdict(lambda: {"segments": 0, "bytes": 0, "active_bytes": 0})
    sites: collections.Counter = collections.Counter()
    for segment in snapshot["segments"]:
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        if pool == (0, 0):
            continue
        entry = per_pool[str(pool)]
        entry["segments"] += 1
        entry["bytes"] += segment["total_size"]
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            entry["active_bytes"] += block["size"]
            frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in block.get("frames", [])
                      if f.get("filename", "").endswith(".py")][:4]
            sites[" < ".join(frames) or "(no Python frame)"] += segment["total_size"] if len(segment["blocks"]) == 1 \
                else block["size"]
    return {"pools": len(per_pool), "segments": sum(p["segments"] for p in per_pool.values()),
            "bytes": sum(p["bytes"] for p in per_pool.values()),
            "active_bytes": sum(p["active_bytes"] for p in per_pool.values()),
            "sites": sites.most_common(top)}


def _device_used_here() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free


def _splits(report) -> list[dict]:
    """How the flush judged each Thunder split, and whether the check compared it."""
    found = []
    for graph in report.graphs:
        for split in graph.splits:
            if split.kind.value != "thunder":
                continue
            triage = split.triage
            found.append({"split": f"{graph.name}/{split.name}",
                          "judged": triage is not None and triage.error is None,
                          "why_not": None if triage is None or triage.error is None else triage.error.splitlines()[0],
                          "check": None if split.check is None else {
                              "calls": split.check.calls, "mismatches": split.check.mismatches,
                              "not_compared": list(split.check.skipped)[:3], "failed": list(split.check.failed)}})
    return found


# ---- the parent -----------------------------------------------------------------------------------------------------
class DeviceWatch:
    """Reads, every `POLL_S` in a thread, the device's used memory and what each process holds (nvidia-smi), and
    attributes each reading to the configurations running then: what the training process held, what its
    descendants (the tool's children) held, in the phase the configuration's process wrote into its phase file."""

    def __init__(self):
        self.watched: dict[int, Path] = {}  # training process id -> its phase file
        self.readings: dict[int, list[tuple[str, int, int, int]]] = {}  # pid -> (phase, device, own, children)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeviceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            used, by_pid = device_used()
            if used is None:
                continue
            for pid, phase_file in list(self.watched.items()):
                phase = phase_file.read_text() if phase_file.exists() else "starting"
                descendants = _descendants(pid)
                self.readings.setdefault(pid, []).append(
                    (phase, used, by_pid.get(pid, 0), sum(by_pid.get(d, 0) for d in descendants)))

    def most(self, pid: int, phase: str) -> dict:
        """The most the training process and its descendants held in `phase`, and the device's most then."""
        seen = [r for r in self.readings.get(pid, []) if r[0] == phase]
        if not seen:
            return {"training_process": None, "other_processes": None, "device": None, "readings": 0}
        return {"training_process": max(r[2] for r in seen), "other_processes": max(r[3] for r in seen),
                "device": max(r[1] for r in seen), "readings": len(seen)}


def device_used() -> tuple[int | None, dict[int, int]]:
    """(the device's used memory in bytes, bytes per process id as nvidia-smi names them)."""
    try:
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                               capture_output=True, text=True, timeout=10).stdout.split()
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, {}
    by_pid = {}
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            by_pid[int(parts[0])] = int(parts[1]) * 2**20
    return (int(total[0]) * 2**20 if total and total[0].isdigit() else None), by_pid


def _descendants(pid: int) -> list[int]:
    """The process ids of `pid`'s children, theirs, and so on (psutil's process tree; none once it has ended)."""
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def run_configuration(args, config: str, model: str, dump: Path, watch: DeviceWatch | None,
                      extra: dict | None = None, repeat: int = 0) -> dict:
    """One configuration in a process of its own, watched (see the module docstring); `repeat` numbers the
    processes of one configuration (`--repeat`)."""
    settings = EVERY_FEATURE if config == "every feature" else CONFIGURATIONS.get(config)
    folder = dump / model / (config.replace(" ", "_").replace("=", "-") + (f"_{repeat}" if repeat else ""))
    folder.mkdir(parents=True, exist_ok=True)
    phase_file = folder / "phase"
    spec = {"config": config, "model": model, "size": args.size, "device": args.device, "steps": args.steps,
            "settings": settings, "phase_file": str(phase_file), **(extra or {})}
    env = {k: v for k, v in os.environ.items() if not k.startswith("THUNDERFX_DEBUG_")}
    env.update({"TORCHINDUCTOR_CACHE_DIR": str(dump / "inductor_cache"), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    if settings is not None:
        env.update({f"THUNDERFX_DEBUG_{k}": v for k, v in settings.items()}, THUNDERFX_DEBUG_DIR=str(folder / "dump"))
    started = time.perf_counter()
    with open(folder / "out.log", "w") as out, open(folder / "err.log", "w") as err:
        process = subprocess.Popen([sys.executable, __file__, args.what, "--child", json.dumps(spec)], env=env,
                                   stdout=out, stderr=err, text=True)
        if watch is not None:
            watch.watched[process.pid] = phase_file
        try:
            process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    stdout = (folder / "out.log").read_text()
    found = next((json.loads(line[len("DEVMEM "):]) for line in stdout.splitlines() if line.startswith("DEVMEM ")),
                 None)
    if found is None:
        return {"config": config, "model": model,
                "error": f"exit {process.returncode}: {(folder / 'err.log').read_text()[-3000:]}"}
    found["seconds"] = round(time.perf_counter() - started, 1)
    if watch is not None:
        found["during_training"] = watch.most(process.pid, "training")
        found["during_flush"] = watch.most(process.pid, "flush")
    return {"model": model, **({"repeat": repeat} if repeat else {}), **found}


def features(args, dump: Path) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    wanted = [(model, config, repeat) for repeat in range(args.repeat)
              for model in [m.strip() for m in args.models.split(",") if m.strip()]
              for config in [c.strip() for c in args.configurations.split(",") if c.strip()]]
    unknown = [config for _, config, _ in wanted if config not in CONFIGURATIONS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; choose from {', '.join(CONFIGURATIONS)}")
    with DeviceWatch() as watch, ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda mcr: run_configuration(args, mcr[1], mcr[0], dump,
                                                           watch if args.device == "cuda" else None, repeat=mcr[2]),
                             wanted))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k not in ("losses", "splits")}), flush=True)
    return {"rows": rows}


def tight(args, dump: Path) -> dict:
    with DeviceWatch() as watch:
        watch = watch if args.device == "cuda" else None
        first = run_configuration(args, "plain", args.model, dump / "footprint", watch, {"deterministic": True})
        if "error" in first or args.device != "cuda":
            return {"footprint_run": first}
        outside = max(0, first["used_after_training"] - first["used_before_model"] - first["reserved_end"])
        footprint = first["peak_reserved"] + outside
        headroom = int(args.headroom_gib * GiB)
        extra = {"deterministic": True, "free_bytes": footprint + headroom, "late_step": args.late_step,
                 "late_bytes": int(args.late_fraction * headroom)}
        runs = {config: run_configuration(args, config, args.model, dump / "tight", watch, extra)
                for config in ("plain", "every feature")}
    plain = runs["plain"]
    for found in runs.values():
        found["parameters_equal_plain"] = found.get("parameters_sha256") == plain.get("parameters_sha256")
    return {"footprint": footprint, "footprint_outside_the_allocator": outside, "headroom": headroom,
            "late_bytes": extra["late_bytes"], "late_step": args.late_step, "steps": args.steps, "runs": runs}


def print_features(rows: list[dict]) -> None:
    print("\n| model | configuration | peak reserved, training process (GiB) | against plain | training process on "
          "the device, training / flush (GiB) | the tool's other processes, training / flush (GiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    plain = {r["model"]: r.get("peak_reserved") for r in rows if r.get("config") == "plain"}

    def gib(value):
        return "n/a" if value is None else f"{value / GiB:.3f}"

    for r in rows:
        if "error" in r and "steps_done" not in r:
            print(f"| {r['model']} | {r['config']} | failed: {r['error'][:80]} | | | |")
            continue
        base = plain.get(r["model"])
        ratio = f"{r['peak_reserved'] / base:.4f}" if base and r.get("peak_reserved") else "n/a"
        training, flush = r.get("during_training", {}), r.get("during_flush", {})
        print(f"| {r['model']} | {r['config']} | {gib(r.get('peak_reserved'))} | {ratio} | "
              f"{gib(training.get('training_process'))} / {gib(flush.get('training_process'))} "
              f"| {gib(training.get('other_processes'))} / {gib(flush.get('other_processes'))} |")
        if r.get("error"):
            print(f"|  | failed after {r.get('steps_done')} steps: {r['error'].splitlines()[0][:200]} | | | | |")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print("DEVMEM " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    import tempfile

    dump = Path(args.dump or tempfile.mkdtemp(prefix="device_memory_")).absolute()
    if args.what == "features":
        results = features(args, dump)
        print_features(results["rows"])
        ok = all("error" not in r for r in results["rows"])
    else:
        results = tight(args, dump)
        print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
        for name, run in results.get("runs", {}).items():
            print(f"{name}: {run.get('steps_done')} of {args.steps} steps; {run.get('error', 'no error')}; "
                  f"parameters equal plain's: {run.get('parameters_equal_plain')}; splits: "
                  + ", ".join(f"{s['split']} {'judged' if s['judged'] else s['why_not']}" for s in run.get("splits", [])))
        ok = bool(results.get("runs")) and all(r.get("steps_done") == args.steps for r in results["runs"].values())
    harness.write_record(args.json, "device_memory", {"figures": results, "args": vars(args)}, argv)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
