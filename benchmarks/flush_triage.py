"""Flush-time triage (THUNDERFX_DEBUG_TRIAGE) of zoo models (benchmarks/harness.py), with the reconciliation: the
judged splits' summed "lost ms per step" against the measured step gap of the same model under ThunderFX and under
inductor, both trained in this process, their steps interleaved pair by pair.

    source .gpu/setup.sh && python benchmarks/flush_triage.py --level split --json $OUT/triage_split.json
    source .gpu/setup.sh && python benchmarks/flush_triage.py --models llama --layers 8 --level fusion --json $OUT/f.json
    python benchmarks/flush_triage.py --device cpu --size tiny --models llama --pairs 6        # smoke test without a GPU
    python benchmarks/flush_triage.py --device cpu --models llama,qwen3 --pairs 0              # the triage alone

Per model: two copies from the same seed (`harness.build`), one compiled by torch.compile (inductor), one by
ReportingBackend with the triage on (Thunder's executors per device, `harness.thunder_options`: nvFuser on CUDA);
`--warmup` steps of each (the compiles), then `--pairs` pairs of steps, one step of each copy on the same batch, the
copy that goes first alternating, the device synchronised around every step. The gap is the trimmed mean of the
pairs' differences (ThunderFX - inductor) with its 95% interval (one-sample trimmed t), the ratio likewise from the
pairs' log ratios. Then the ThunderFX copy's flush, timed: the triage's seconds (compiling and timing apart), every
Thunder split's verdict or why it was not judged, and the reconciliation: the judged splits' net against the gap,
and what they leave unattributed. The ThunderFX copy samples its splits every `--timing-every` steps
(THUNDERFX_DEBUG_TIMING=split), so that each triaged split's time in its process is set beside the run's own.

What the triage's isolation costs: the flush's wall seconds (the children's start, Thunder compiling each split again,
inductor compiling it, the timing), and on CUDA the device memory of the triage's children, the most `nvidia-smi`
saw them hold at once while the flush ran (polled every 0.2 s; their CUDA contexts and what they allocated).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

DECODERS = ("llama", "qwen3", "gptneox", "phi3", "mistral", "qwen2", "gemma", "opt", "gpt2")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,qwen3,gptneox",
                        help=f"comma list of zoo models (default llama,qwen3,gptneox; decoders: {', '.join(DECODERS)})")
    parser.add_argument("--size", default=None, choices=sorted(harness.SIZES),
                        help="zoo size (default: realistic on CUDA, tiny on CPU)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the size's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--level", default="split", choices=("split", "fusion"))
    parser.add_argument("--no-attention-mask", action="store_true",
                        help="call the models as model(input_ids=..., labels=...): Hugging Face decoders then pass "
                             "the decoder split position ids and a view of them")
    parser.add_argument("--warmup", type=int, default=4, help="steps of each copy before the pairs (default 4)")
    parser.add_argument("--pairs", type=int, default=20,
                        help="timed pairs of steps (default 20); 0: no inductor copy, the triage alone")
    parser.add_argument("--train-s", type=float, default=0.0,
                        help="go on training the ThunderFX copy until this many seconds after its warm-up before "
                             "the flush, as a run trains between its start and its first flush (on CUDA the "
                             "triage's children compile the splits meanwhile, ahead of the flush; default 0)")
    parser.add_argument("--timing-every", type=int, default=6,
                        help="THUNDERFX_DEBUG_TIMING_EVERY of the ThunderFX copy, which samples its splits (default 6)")
    parser.add_argument("--inputs", default="meta", choices=("meta", "real"),
                        help="THUNDERFX_DEBUG_INPUTS of the ThunderFX copy (default meta)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no further model after this many seconds (a lent machine's limit)")
    parser.add_argument("--json", help="write the figures here (after each model)")
    args = parser.parse_args(argv)
    args.size = args.size or ("realistic" if args.device == "cuda" else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if 0 < args.pairs < 4:
        parser.error("--pairs must be 0 or at least 4 (the interval trims a fifth of them at each end)")
    return args


def paired(thunder_ms: list[float], inductor_ms: list[float]) -> dict:
    """The pairs' gap (ms) and ratio, each a 20%-trimmed mean with its 95% interval (one-sample trimmed t).

    Example:
        >>> g = paired([3.0, 3.1, 2.9, 3.0], [1.0, 1.0, 1.0, 1.0])
        >>> round(g["gap_ms"], 2), round(g["ratio"], 2), g["pairs"]
        (2.0, 3.0, 4)
    """
    from thunderfx_debug.records import stats as noise

    def interval(values):
        t = noise.trimmed(values)
        half = noise.t_isf(0.025, max(t.kept - 1, 1)) * math.sqrt(t.error2)
        return t.mean, t.mean - half, t.mean + half

    gap = interval([a - b for a, b in zip(thunder_ms, inductor_ms)])
    log_ratio = interval([math.log(a / b) for a, b in zip(thunder_ms, inductor_ms) if a > 0 and b > 0])
    return {"gap_ms": gap[0], "gap_low_ms": gap[1], "gap_high_ms": gap[2], "ratio": math.exp(log_ratio[0]),
            "ratio_low": math.exp(log_ratio[1]), "ratio_high": math.exp(log_ratio[2]), "pairs": len(thunder_ms)}


def build_copies(name: str, args) -> tuple:
    """The ThunderFX copy (ReportingBackend with the triage on) and, with --pairs, the inductor copy of one model,
    each a harness.Trainer on the same batch; with the backend, the batch and the size."""
    from thunderfx_debug import ReportingBackend

    size = harness.SIZES[args.size]
    if args.layers is not None:
        size = dataclasses.replace(size, layers=args.layers)
    harness.SIZES["benchmark"] = size
    thunder_model, batch = harness.build(name, "benchmark", args.device, args.dtype)
    if args.no_attention_mask:
        batch.pop("attention_mask")
    backend = ReportingBackend(tempfile.mkdtemp(prefix=f"triage_{name}_"), triage=args.level, flush_every=0,
                               inputs=args.inputs, inputs_max_mb=4096, timing="split", timing_every=args.timing_every,
                               timing_warmup=1, **harness.thunder_options(args.device))
    copies = {"thunderfx": harness.Trainer(thunder_model, backend, [batch], lr=1e-4, device=args.device)}
    if args.pairs:
        inductor_model = harness.build(name, "benchmark", args.device, args.dtype)[0]
        copies["inductor"] = harness.Trainer(inductor_model, "inductor", [batch], lr=1e-4, device=args.device)
    return copies, backend, size


def step_gap(copies: dict, args) -> dict:
    """--warmup steps of each copy, then --pairs pairs of steps (the copy that goes first alternating), each step
    timed with the device synchronised around it; the pairs' gap and ratio."""
    started = time.perf_counter()
    for copy in copies.values():
        for _ in range(args.warmup):
            copy.step()
    copies["thunderfx"].clock.sync()
    warmed_at = time.perf_counter()
    warmup_s = warmed_at - started
    if not args.pairs:
        return {"warmup_s": warmup_s, "warmed_at": warmed_at, "inductor_step_ms": [], "thunderfx_step_ms": [],
                "gap_ms": None, "gap_low_ms": None, "gap_high_ms": None, "ratio": None, "ratio_low": None, "ratio_high": None,
                "pairs": 0}
    steps = harness.interleaved({side: (lambda c=copy: c.timed_step()[1]) for side, copy in copies.items()},
                                args.pairs)
    return {"warmup_s": warmup_s, "warmed_at": warmed_at, "inductor_step_ms": steps["inductor"],
            "thunderfx_step_ms": steps["thunderfx"],
            **paired(steps["thunderfx"], steps["inductor"])}


def train_before_flush(copy, seconds: float) -> dict:
    """Steps of the ThunderFX copy for `seconds` more (none where it is not positive); the steps, and the most device
    memory the other processes on the GPU held meanwhile (the children compiling ahead of the flush)."""
    steps = 0
    with ChildrenMemory() as memory:
        ends = time.perf_counter() + seconds
        while time.perf_counter() < ends:
            copy.step()
            steps += 1
        if steps:
            copy.clock.sync()
    return {"steps_before_flush": steps, "children_device_mb_before_flush": memory.most_mb if steps else None}


def triage_figures(backend) -> dict:
    """The ThunderFX copy's flush, timed, and a second one; the triage's seconds and every piece's verdict."""
    from internals import keeping_triage_step_lines

    from thunderfx_debug import load_report
    from thunderfx_debug.render import triage_findings as flush_triage

    with tempfile.TemporaryDirectory() as lines, keeping_triage_step_lines(lines), ChildrenMemory() as memory:
        started, started_at = time.perf_counter(), time.time()
        rank_dir = backend.flush()
        flush_s = time.perf_counter() - started
        timeline = flush_timeline(Path(lines), started_at, flush_s)
    started = time.perf_counter()
    backend.flush()  # the triage is kept: a second flush times nothing again
    second_flush_s = time.perf_counter() - started
    report = load_report(rank_dir)
    pieces = flush_triage.triaged_pieces(report)
    totals = flush_triage.totals(report)
    timed = [p.triage for p in pieces if p.triage.compile_s is not None]
    compile_s = sum(t.compile_s or 0.0 for t in timed)
    timing_s = sum(t.timing_s or 0.0 for t in timed)
    judged = [p for p in pieces if p.triage.error is None]
    return {
        "flush_s": flush_s, "second_flush_s": second_flush_s, "triage_s": compile_s + timing_s,
        "children_device_mb": memory.most_mb,
        "triage_compile_s": compile_s, "triage_timing_s": timing_s,
        "thunder_splits": [f"{g.name}/{s.name}" for g in report.graphs for s in g.splits if s.kind.value == "thunder"],
        "splits_judged": sum(p.level == "split" for p in judged),
        "regions_judged": sum(p.level == "fusion" for p in judged),
        "triage_lost_ms": totals.lost_ms, "triage_gained_ms": totals.gained_ms, "triage_net_ms": totals.net_ms,
        "pieces": [{"piece": p.path, "level": p.level, "executor": p.executor, "thunder_ms": p.triage.thunder_ms,
                    "inductor_ms": p.triage.inductor_ms, "ratio": p.triage.ratio, "ratio_low": p.triage.ratio_low,
                    "ratio_high": p.triage.ratio_high, "ms_per_step": p.triage.ms_per_step,
                    "deviates": p.triage.deviates, "rounds": p.triage.rounds, "clock": p.triage.clock.value,
                    "inputs": p.triage.inputs, "compile_s": p.triage.compile_s, "timing_s": p.triage.timing_s,
                    "run_ms": p.triage.run_ms, "run_samples": p.triage.run_samples,
                    "unlike_the_run": p.triage.unlike_the_run}
                   for p in judged],
        "not_judged": [{"piece": p.path, "error": p.triage.error} for p in pieces if p.triage.error is not None],
        "dump": str(rank_dir),
        "timeline": timeline,
    }


def flush_timeline(lines: Path, started_at: float, flush_s: float) -> dict:
    """Where the flush's seconds went, from the step lines the triage's children wrote with their wall-clock times:
    per split, each step's start (s from the flush's start; negative: a child compiling ahead of the flush, during
    training) and how long it lasted until the next line of the same child (the last step, the timing, until the
    child's verdict line, which has no time: None); when the first child began its first step within the flush
    (before it: the flush's own work, writing the jobs, and the children's start); when the last step began; and the
    flush's end.

    Example (one split, its child's steps at 3 s and 10 s of a 14 s flush):
        >>> import json, tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "split0"; folder.mkdir()
        >>> _ = (folder / "results.jsonl").write_text(chr(10).join(json.dumps(d) for d in (
        ...     {"piece": "g/t0", "step": "compiling", "attempt": 0, "at": 103.0},
        ...     {"piece": "g/t0", "step": "timing", "attempt": 0, "at": 110.0})))
        >>> t = flush_timeline(folder.parent, 100.0, 14.0)
        >>> t["first_step_s"], t["last_step_s"], [(s["step"], s["at_s"], s["lasted_s"]) for s in t["splits"]["split0"]]
        (3.0, 10.0, [('compiling', 3.0, 7.0), ('timing', 10.0, None)])
    """
    import json

    splits = {}
    for results in sorted(lines.glob("*/results.jsonl")):
        steps = []
        for line in results.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "step" in entry and isinstance(entry.get("at"), (int, float)):
                steps.append({"piece": entry.get("piece"), "step": entry["step"], "attempt": entry.get("attempt"),
                              "at_s": round(entry["at"] - started_at, 3)})
        steps.sort(key=lambda s: s["at_s"])
        for step, after in zip(steps, steps[1:] + [None]):
            same_child = after is not None and after["attempt"] == step["attempt"]
            step["lasted_s"] = round(after["at_s"] - step["at_s"], 3) if same_child else None
        splits[results.parent.name] = steps
    # Steps before the flush's start are those of the children that compiled ahead of it, during training.
    starts = [s["at_s"] for steps in splits.values() for s in steps if s["at_s"] >= 0]
    return {"splits": splits, "first_step_s": min(starts, default=None), "last_step_s": max(starts, default=None),
            "flush_s": flush_s}


class ChildrenMemory:
    """The most device memory (MB) the other processes on the GPU held at once while the block ran, as `nvidia-smi`
    reports its compute processes (None without nvidia-smi): on this benchmark's machine, the triage's children."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s, self.most_mb = interval_s, None
        self._stop = None

    def _poll(self) -> None:
        import os
        import subprocess

        while not self._stop.is_set():
            try:
                done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return
            used = [int(mb) for pid, mb in (line.split(",") for line in done.stdout.strip().splitlines() if "," in line)
                    if int(pid) != os.getpid() and mb.strip().isdigit()]
            self.most_mb = max(self.most_mb or 0, sum(used))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "ChildrenMemory":
        import shutil
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True) if shutil.which("nvidia-smi") else None
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_model(name: str, args) -> dict:
    import torch

    copies, backend, size = build_copies(name, args)
    gap = step_gap(copies, args)
    trained = train_before_flush(copies["thunderfx"], args.train_s - (time.perf_counter() - gap.pop("warmed_at")))
    result = {"model": name, "size": args.size, "layers": size.layers, "dtype": args.dtype, "device": args.device,
              "level": args.level, "attention_mask": not args.no_attention_mask, **gap, **trained,
              **triage_figures(backend)}
    thunder_splits = result["thunder_splits"]
    result["thunder_splits"] = len(thunder_splits)
    result["unattributed_ms"] = gap["gap_ms"] - result["triage_net_ms"] if args.pairs else None
    _print(result, thunder_splits)
    del backend, copies
    torch._dynamo.reset()
    return result


def _print(r: dict, thunder_splits: list[str]) -> None:
    print(f"\n== {r['model']} ({r['size']}, {r['layers']} layers, {r['dtype']}, {r['device']}, TRIAGE={r['level']}"
          f"{'' if r['attention_mask'] else ', no attention mask'}): {r['thunder_splits']} Thunder splits, "
          f"{r['splits_judged']} judged" + (f", {r['regions_judged']} fusion regions judged" if r['level'] == 'fusion'
                                           else "") + f", {len(r['not_judged'])} pieces not judged")
    memory = r["children_device_mb"]
    print(f"   flush {r['flush_s']:.1f} s, of which the pieces' inductor compiles and first calls "
          f"{r['triage_compile_s']:.1f} s and timing {r['triage_timing_s']:.1f} s, in the triage's children (the "
          f"rest: their start and Thunder compiling each split again); a second flush {r['second_flush_s']:.1f} s"
          + (f"; the children held at most {memory} MB of device memory" if memory is not None else ""))
    net = (f"the judged splits lose {r['triage_lost_ms']:.3f} ms and gain {-r['triage_gained_ms']:.3f} ms per "
           f"step: net {r['triage_net_ms']:+.3f} ms")
    if not r["pairs"]:
        print(f"   {net}")
    else:
        thunder, inductor = sorted(r["thunderfx_step_ms"]), sorted(r["inductor_step_ms"])
        print(f"   step: ThunderFX {thunder[len(thunder) // 2]:.3f} ms, inductor {inductor[len(inductor) // 2]:.3f} ms "
              f"(medians); gap {r['gap_ms']:+.3f} ms [{r['gap_low_ms']:+.3f}, {r['gap_high_ms']:+.3f}], ratio "
              f"{r['ratio']:.2f}x [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}] over {r['pairs']} interleaved pairs")
        share = f" ({r['triage_net_ms'] / r['gap_ms']:.0%} of the gap)" if abs(r["gap_ms"]) > 1e-9 else ""
        print(f"   {net}{share}; not attributed: {r['unattributed_ms']:+.3f} ms (what the splits' own times leave "
              "out: the code between splits and ThunderFX's inductor splits against inductor's one compile of the "
              "whole graph, per-call host work where the step waits for the host, the backend's own work; the clocks "
              "differ too: the pieces' device time on CUDA against the step's wall time)")
    timeline = r.get("timeline") or {}
    if timeline.get("first_step_s") is not None:
        if r.get("steps_before_flush"):
            memory = r.get("children_device_mb_before_flush")
            print(f"   trained {r['steps_before_flush']} more steps before the flush (--train-s); where the "
                  "flush's children are fresh interpreters (CUDA), some compiled splits ahead of it meanwhile (their "
                  "steps at negative times below)"
                  + (f"; the GPU's other processes held at most {memory} MB meanwhile" if memory is not None else ""))
        print(f"   the children's first step within the flush began {timeline['first_step_s']:.1f} s into it (the "
              f"jobs written, the children started or given the word), their last {timeline['last_step_s']:.1f} s "
              f"in, of {r['flush_s']:.1f} s:")
        for split, steps in timeline["splits"].items():
            print(f"     {split}: " + "; ".join(
                f"{s['step']} at {s['at_s']:.1f} s" + (f" ({s['lasted_s']:.1f} s)" if s["lasted_s"] is not None else "")
                for s in steps))
    for p in r["pieces"]:
        run = (f", the run's own {p['run_ms']:.3f} ms ({p['run_samples']} samples)"
               + ("  UNLIKE THE RUN" if p["unlike_the_run"] else "") if p["run_ms"] is not None else "")
        print(f"   {p['piece']:45s} {p['ratio']:6.2f}x [{p['ratio_low']:.2f}, {p['ratio_high']:.2f}] "
              f"{p['ms_per_step']:+8.3f} ms/step, {p['rounds']} rounds, compile {p['compile_s']:.1f} s; "
              f"Thunder {p['thunder_ms']:.3f} ms in its process{run}{'  DEVIATES' if p['deviates'] else ''}")
    for f in r["not_judged"]:
        print(f"   not judged: {f['piece']}: {f['error'].partition(chr(10))[0]}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import thunderfx_debug  # noqa: F401  (before thunder)

    results = []
    started = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in harness.MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(harness.MODELS)}")
        if args.deadline_s is not None and time.perf_counter() - started > args.deadline_s:
            print(f"\n== {name}: skipped, past --deadline-s {args.deadline_s:g}")
            results.append({"model": name, "skipped": f"past --deadline-s {args.deadline_s:g}"})
            continue
        results.append(run_model(name, args))
        harness.write_record(args.json, "flush_triage", results, argv)  # after each model: a run cut short keeps it
    return 0


if __name__ == "__main__":
    sys.exit(main())
