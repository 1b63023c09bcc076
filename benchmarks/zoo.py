"""The Hugging Face zoo of `harness.py` (built from configs: no weights, no network) trained under ReportingBackend
with every repro script dumped; then every script of every model verified as `thunderfx-debug verify` does (long-lived
workers, each script as `__main__` where thunderfx_debug cannot be imported), and the verdicts counted per model
and kind.

    python benchmarks/zoo.py --device cpu --models llama,gpt2 --jobs 2 --json zoo_cpu.json      # the torch.compile executor
    source .gpu/setup.sh && python benchmarks/zoo.py --device cuda --size realistic --dtype bfloat16 \\
        --models gpt2 --jobs 8 --single 5 --json zoo_h200.json                              # nvFuser, one H200
    source .gpu/setup.sh && python benchmarks/zoo.py --device cuda --size realistic --dtype bfloat16 \\
        --models gpt2-dropout,t5-dropout,mixtral --check fusion --jobs 8 --json zoo_h200_moe_t5.json

Each model trains in its own process (`--train-jobs` at a time) for `--steps` steps with THUNDERFX_DEBUG_REPRO=all
(and with `--check`, the correctness sentinel checking every call at that level; its verdicts are in the JSON),
all sharing inductor's and Triton's cache directories under the dump (`<dump>/inductor_cache`, `triton_cache`),
which the scripts then use too; verify's files are written into the dump (`verify.json`, `verify.md`, `verify/`).
Deterministic pieces must be OK; random ones (the `-dropout` models) OK where they draw as eager does, else NOT
COMPARABLE. `--single N` then runs the first nvFuser fusion script (else the first fusion script) N times alone in a
fresh interpreter, as `python script.py` would, imports included.

`--every-feature` trains as a user who switched everything on does (THUNDERFX_DEBUG_TIMING=fusion and CHECK=fusion
every 5 calls, TRIAGE=split, MINIMIZE=1, not strict: a failure of the reporting is recorded, not raised), and the
facts of each model then say, per Thunder split, whether its scripts were written and how its triage ended (judged,
or not judged and why), and list the reporting failures. `--no-verify` stops after training.

Writes (with --json) every script's verdict and seconds, the training and verify times, the counts; prints a Markdown
table of passes per model and kind (for benchmarks/RESULTS.md) and the failures with their RESULT lines. Exit status
1 where a model failed to train or a script was neither OK nor NOT COMPARABLE.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

KINDS = ("graph_eager", "graph_thunder", "graph_torchcompile", "split_eager", "split_thunder", "split_inductor",
         "fusion_nvfuser", "fusion_inductor")


#: What `--every-feature` switches on (see the module docstring).
EVERY_FEATURE = dict(timing="fusion", timing_every=5, check="fusion", check_every=5, triage="split", minimize=True,
                     strict=False)


def train(name: str, dump: Path, device: str, size: str, dtype: str, steps: int, check: str = "off",
          every_feature: bool = False, minimize_budget: float | None = None) -> dict:
    """Trains one model under ReportingBackend (all repro scripts; `check`: the sentinel at that level on every
    call; `every_feature`: see the module docstring), flushes, and returns facts of the run."""
    started = time.perf_counter()
    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on this torch)
    import torch

    from thunderfx_debug import ReportingBackend

    if device == "cpu":
        torch.set_num_threads(1)
    model, batch = harness.build(name, size, device, dtype)
    settings = dict(EVERY_FEATURE) if every_feature else dict(strict=True, check=check, check_every=1)
    if every_feature and minimize_budget is not None:
        settings["minimize_budget"] = minimize_budget
    backend = ReportingBackend(dump_dir=dump, repro="all", **settings, **harness.thunder_options(device))
    losses = harness.train(model, batch, backend, steps)
    flush_started = time.perf_counter()
    rank_dir = backend.flush()
    flush_s = time.perf_counter() - flush_started
    report = backend.report()
    splits = [s for g in report.graphs for s in g.splits]
    facts = {"model": name, "dump": str(rank_dir), "train_s": round(time.perf_counter() - started, 1),
            "flush_s": round(flush_s, 1), "losses": [round(float(x), 4) for x in losses], "graphs": len(report.graphs),
            "thunder_splits": sum(s.kind.value == "thunder" for s in splits),
            "inductor_splits": sum(s.kind.value == "inductor" for s in splits),
            "fusions": sum(len(s.fusions) for s in splits),
            "check_mismatches": [f"{g.name}/{p}" for g in report.graphs for p, c in _checks(g) if c.mismatches],
            "check_failed": [f"{g.name}/{p}" for g in report.graphs for p, c in _checks(g) if c.failed],
            "reporting_failures": report.meta.get("reporting_failures", [])}
    if every_feature:  # from the dump: its records list the files written
        dumped = thunderfx_debug.load_report(rank_dir)
        facts["splits"] = {f"{g.name}/{s.name}": split_facts(s) for g in dumped.graphs for s in g.splits
                           if s.kind.value == "thunder"}
    return facts


def split_facts(split) -> dict:
    """Whether a Thunder split's scripts were written, how its triage and checks ended."""
    triage = split.triage
    return {"scripts": sorted(k for k in split.files if k.startswith("repro")),
            "triage": None if triage is None else (
                "judged" if triage.error is None else ("died: " if triage.died else "not judged: ")
                + triage.error.partition("\n")[0][:300]),
            "ratio": None if triage is None else triage.ratio,
            "check": None if split.check is None else {"calls": split.check.calls,
                                                       "mismatches": split.check.mismatches},
            "fusion_checks": {f"{f.name}_{f.phase.value}": f.check.mismatches for f in split.fusions
                              if f.check is not None and f.check.mismatches}}


def _checks(graph):
    """(piece name, check) of every split and fusion region of `graph` that was checked."""
    for split in graph.splits:
        if split.check is not None:
            yield split.name, split.check
        for fusion in split.fusions:
            if fusion.check is not None:
                yield f"{split.name}/{fusion.qualified_name}", fusion.check


def _train_all(models: list[str], args, dump: Path, env: dict[str, str]) -> dict[str, dict]:
    """Trains each model in its own process, `--train-jobs` at a time; model -> its facts (or {"error": ...})."""

    def one(model: str) -> tuple[str, dict]:
        command = [sys.executable, __file__, "--train", model, "--device", args.device, "--size", args.size,
                   "--dtype", args.dtype, "--steps", str(args.steps), "--dump", str(dump), "--check", args.check]
        if args.every_feature:
            command.append("--every-feature")
        if args.minimize_budget is not None:
            command += ["--minimize-budget", str(args.minimize_budget)]
        # The child prints every thread's stack shortly before the timeout, so that a run that does not end says where.
        command += ["--stacks-after", str(max(1.0, args.train_timeout - 15))]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.train_timeout)
        except subprocess.TimeoutExpired as late:
            stderr = late.stderr.decode(errors="replace") if isinstance(late.stderr, bytes) else (late.stderr or "")
            return model, {"error": f"training did not end within {args.train_timeout:.0f} s", "stderr": stderr[-6000:]}
        lines = [line for line in done.stdout.splitlines() if line.startswith("ZOO ")]
        if done.returncode != 0 or not lines:
            return model, {"error": (done.stdout[-1000:] + "\n" + done.stderr[-3000:]).strip()}
        return model, json.loads(lines[-1][4:])

    with ThreadPoolExecutor(max_workers=max(1, args.train_jobs)) as pool:
        return dict(pool.map(one, models))


def verify_zoo(trained: dict[str, dict], dump: Path, args, env: dict[str, str]):
    """(model of each script, verdicts, seconds): every script of every trained model, in one pool of workers."""
    from internals import verify
    from thunderfx_debug import load_report

    reports = {Path(f["dump"]): load_report(f["dump"]) for f in trained.values() if "error" not in f}
    scripts = verify.select(verify.scripts_of(reports, dump), args.only)
    damaged = [s.problem for s in scripts if s.problem]
    if damaged:
        raise SystemExit(f"damaged dump: {damaged[0]}")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = tuple(args.gpus.split(",")) if args.gpus else ((visible[0] if visible else "0",) if args.device == "cuda"
                                                             else ())
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    started = time.perf_counter()
    verdicts = verify.run(scripts, dump, args.jobs, devices, args.timeout, deadline=deadline, env=env)
    seconds = time.perf_counter() - started
    meta = {"dir": str(dump), "where": f"{args.jobs} workers" + (f" on GPUs {','.join(devices)}" if devices else
                                                                 " on the CPU"), "seconds": round(seconds, 1)}
    (dump / verify.VERIFY_JSON).write_text(verify.verify_json(verdicts, meta))
    (dump / verify.VERIFY_MD).write_text(verify.verify_md(verdicts, dump, meta))
    return [v.script.path.split(os.sep)[0] for v in verdicts], verdicts, seconds


def single(verdicts, runs: int, env: dict[str, str]) -> dict | None:
    """Wall seconds of one fusion script run alone `runs` times in a fresh interpreter (imports included)."""
    from internals import run_script

    candidates = ([v for v in verdicts if v.script.kind == "fusion_nvfuser" and v.outcome == "OK"]
                  or [v for v in verdicts if v.script.kind.startswith("fusion_") and v.outcome == "OK"])
    if not candidates or runs <= 0:
        return None
    script = candidates[0].script
    walls = [run_script(script.file, env=env) for _ in range(runs)]
    return {"script": script.path, "outcomes": [w.outcome for w in walls], "wall_s": [round(w.wall_s, 2) for w in walls],
            "median_s": round(statistics.median(w.wall_s for w in walls), 2)}


def table(rows: list[dict]) -> str:
    """Markdown: OK / scripts per model and kind, then the other verdicts per model."""
    models = list(dict.fromkeys(row["model"] for row in rows))
    kinds = [k for k in KINDS if any(row["kind"] == k for row in rows)]
    kinds += sorted({row["kind"] for row in rows} - set(kinds))
    lines = ["| model | " + " | ".join(kinds) + " | not OK |", "| --- |" + " --- |" * (len(kinds) + 1)]
    for model in models:
        mine = [row for row in rows if row["model"] == model]
        cells = []
        for kind in kinds:
            of_kind = [row for row in mine if row["kind"] == kind]
            cells.append(f"{sum(row['verdict'] == 'OK' for row in of_kind)}/{len(of_kind)}" if of_kind else "")
        others = Counter(row["verdict"] for row in mine if row["verdict"] != "OK")
        cells.append(", ".join(f"{n} {verdict}" for verdict, n in sorted(others.items())) or "none")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--models", default=",".join(harness.MODELS), help=f"comma list of {', '.join(harness.MODELS)}")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--size", default="tiny", choices=tuple(harness.SIZES))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--check", default="off", choices=("off", "split", "fusion"),
                        help="the correctness sentinel on every call at this level (default off)")
    parser.add_argument("--dump", default="zoo_dump", help="dump directory (one folder per model)")
    parser.add_argument("--train-jobs", type=int, default=1, help="models trained at once (default 1)")
    parser.add_argument("--train-timeout", type=float, default=1800, help="seconds per model's training")
    parser.add_argument("--jobs", type=int, default=2, help="verify's workers (default 2)")
    parser.add_argument("--gpus", default=None, help="verify on these GPUs, CUDA_VISIBLE_DEVICES entries (default on "
                        "cuda: the first visible GPU)")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB", help="only these scripts (verify's --only)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per script")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after verify starts by which every "
                        "script must have started: those that cannot are NOT_RUN (default: no deadline)")
    parser.add_argument("--single", type=int, default=0, metavar="N",
                        help="then run one fusion script alone N times in a fresh interpreter and time it")
    parser.add_argument("--json", help="write the verdicts and figures here")
    parser.add_argument("--every-feature", action="store_true", help="train with every feature on (see above)")
    parser.add_argument("--minimize-budget", type=float, default=None,
                        help="with --every-feature: seconds of minimizing per flagged piece (the backend's default else)")
    parser.add_argument("--no-verify", action="store_true", help="stop after training (its facts only)")
    parser.add_argument("--train", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--stacks-after", type=float, default=None, help=argparse.SUPPRESS)  # the child's, see above  # a child: train one model, print JSON
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in harness.MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(harness.MODELS)}")
    return args


def environment(dump: Path, device: str) -> dict[str, str]:
    """The children's environment: no THUNDERFX_DEBUG_ settings, one inductor and Triton cache for training and
    scripts, and on CPU one compile thread per process (no pool of compile workers each)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THUNDERFX_DEBUG_")}
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(dump / "inductor_cache"))
    env.setdefault("TRITON_CACHE_DIR", str(dump / "triton_cache"))
    if device == "cpu":
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return env


def summary(args, trained: dict, rows: list[dict], train_s: float, verify_s: float, alone: dict | None) -> dict:
    ran = [r for r in rows if r["verdict"] not in ("NOT_RUN", "TIMEOUT")]
    medians = {kind: round(statistics.median(r["seconds"] for r in ran if r["kind"] == kind), 2)
               for kind in sorted({r["kind"] for r in ran})}
    return {"device": args.device, "size": args.size, "dtype": args.dtype, "steps": args.steps,
            "train_s": round(train_s, 1), "verify_s": round(verify_s, 1), "jobs": args.jobs, "median_s": medians,
            "single": alone, "models": trained, "scripts": rows,
            "counts": {m: dict(Counter(r["verdict"] for r in rows if r["model"] == m)) for m in trained}}


def print_summary(figures: dict) -> None:
    rows = figures["scripts"]
    print(table(rows))
    for row in rows:
        if row["verdict"] not in ("OK", "NOT_COMPARABLE"):
            print(f"\n{row['verdict']}: {row['path']}\n  {row['line'] or row['note'] or 'no RESULT line: ' + row['log']}")
    for model, facts in figures["models"].items():
        if "error" in facts:
            print(f"\nTRAINING FAILED: {model}\n{facts['error']}\n{facts.get('stderr', '')}")
    print(f"\ntraining {figures['train_s']:.0f} s; verify: {len(rows)} scripts in {figures['verify_s']:.0f} s "
          f"({figures['jobs']} workers)")
    print("median seconds per script in a worker: " + ", ".join(f"{k} {s}" for k, s in figures["median_s"].items()))
    alone = figures["single"]
    if alone is not None:
        print(f"alone in a fresh interpreter: {alone['script']}: {alone['wall_s']} s (median {alone['median_s']} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dump = Path(args.dump).absolute()
    if args.train:
        if args.stacks_after:
            faulthandler.dump_traceback_later(args.stacks_after, exit=False)
        print("ZOO " + json.dumps(train(args.train, dump / args.train, args.device, args.size, args.dtype,
                                        args.steps, args.check, args.every_feature, args.minimize_budget)))
        return 0
    env = environment(dump, args.device)
    started = time.perf_counter()
    trained = _train_all(args.models, args, dump, env)
    train_s = time.perf_counter() - started
    if args.no_verify:
        print(json.dumps(trained, indent=1))
        harness.write_record(args.json, "zoo", {"train_s": round(train_s, 1), "models": trained}, argv)
        return 1 if any("error" in f for f in trained.values()) else 0
    owners, verdicts, verify_s = verify_zoo(trained, dump, args, env)
    rows = [{"model": model, **v.to_json()} for model, v in zip(owners, verdicts)]
    figures = summary(args, trained, rows, train_s, verify_s, single(verdicts, args.single, env))
    print_summary(figures)
    harness.write_record(args.json, "zoo", figures, argv)
    clean = all(r["verdict"] in ("OK", "NOT_COMPARABLE") for r in rows)
    return 1 if any("error" in f for f in trained.values()) or not clean else 0


if __name__ == "__main__":
    sys.exit(main())
