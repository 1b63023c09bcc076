"""From the GPT's faulty nvFuser region to its minimal script: train, let the correctness sentinel flag the region,
minimize the region's mismatch script (`thunderfx-debug minimize`), run the minimal script on its own.

    source .gpu/setup.sh && python benchmarks/minimize.py --json minimize_h200.json          # H200, nvFuser
    python benchmarks/minimize.py --tiny --json benchmarks/results/minimize_cpu_tiny.json    # CPU proof of the script

1. A worker process trains the GPT of `thunderfx_debug.commands.models` (the 12-layer `GPT_12_LAYER`, bf16, batch
   --batch, Thunder's default executors: nvFuser) for --steps steps under ReportingBackend with
   THUNDERFX_DEBUG_CHECK=fusion checking every call, writing its dump after every step (on the H200 the region's stray
   writes may kill the run; its findings are on disk by then). --tiny: a 2-layer GPT (d 32, float32) on CPU with a
   fusion executor of the tests (`tests/wrong_fusions.py`) that computes tanh wrongly inside its regions, in place of
   nvFuser's fault.
2. --way command (the default on CUDA): the mismatch script of --region (default nvFusion0_forward) of the first
   split that holds one is minimized within --budget seconds, as `thunderfx-debug minimize` does, its trials in
   children of a fresh server process; the time is the whole command's, wall clock. --way flush (the default with
   --tiny): the worker trains with THUNDERFX_DEBUG_MINIMIZE=1 and the region is minimized at the first flush, in the
   training process (a custom executor's region can only be minimized there: its mismatch script reruns the region
   with inductor, not with the executor); the time is the record's.
3. The minimal script runs in a fresh interpreter where thunderfx_debug cannot be imported (with the tests' executor
   registered by a sitecustomize under --tiny); its verdict must be the full piece's failure (same outcome), and for
   nvFuser it must not import Thunder.
One JSON: the region, ops before and after, kept ops, trials, seconds, both verdicts, whether the minimal script
imports Thunder, and `ok` (at most --max-ops ops, default 5, and still failing). Exit status 1 when not ok.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TINY_WRONG_OP = "tanh"  # GELU's tanh, inside the forward region


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT on CPU with a wrong fusion executor")
    parser.add_argument("--steps", type=int, default=2, help="training steps, every call checked (default 2)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; tiny 4)")
    parser.add_argument("--region", default=None,
                        help="the region to minimize (default nvFusion0_forward; tiny WrongFusion0_forward)")
    parser.add_argument("--way", choices=("command", "flush"), default=None,
                        help="minimize with the command (default on CUDA) or at flush (default with --tiny)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds of shrinking (default 600)")
    parser.add_argument("--max-ops", type=int, default=5, help="ops the minimal region may keep (default 5)")
    parser.add_argument("--out", type=Path, default=None, help="the dump's directory (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--train-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.batch = args.batch or (4 if args.tiny else 8)
    args.region = args.region or ("WrongFusion0_forward" if args.tiny else "nvFusion0_forward")
    args.way = args.way or ("flush" if args.tiny else "command")
    return args


# ---- the training worker ----------------------------------------------------------------------------------------

def train(args: argparse.Namespace) -> None:
    import torch

    import thunderfx_debug  # noqa: F401  (before thunder)
    import thunder
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import GPT, GPT_12_LAYER, GPTConfig, synthetic_batches

    if args.tiny:
        from wrong_fusions import wrong_fusion_executor

        torch.set_num_threads(1)
        config, device, dtype = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32), "cpu", None
        options = {"executors": [wrong_fusion_executor(TINY_WRONG_OP), *thunder.get_default_executors()]}
    else:
        config, device, dtype, options = GPT_12_LAYER, "cuda", torch.bfloat16, {}
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=dtype)
    if args.way == "flush":
        options.update(minimize=True, minimize_budget=args.budget)
    backend = ReportingBackend(dump_dir=args.out, check="fusion", check_every=1, **options)
    batches = [b for _, b in zip(range(args.steps), synthetic_batches(config, args.batch, device))]
    trainer = harness.Trainer(model, backend, batches, lr=1e-4, device=device)
    for step in range(args.steps):
        loss = trainer.step()
        print(f"step {step}: loss {float(loss.float()):.4f}", flush=True)
        backend.flush()  # the findings are on disk before the next step, which the fault may kill


# ---- the parent ---------------------------------------------------------------------------------------------------

def _tiny_environment(folder: Path) -> dict[str, str]:
    """Processes that register the tests' wrong executor at start (a sitecustomize, without thunderfx_debug)."""
    from internals import script_support

    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "thunder_import.py").write_text(Path(script_support.__file__).read_text())
    (site / "sitecustomize.py").write_text(
        "from thunder_import import import_thunder\nimport_thunder()\nimport wrong_fusions\n"
        f"wrong_fusions.wrong_fusion_executor({TINY_WRONG_OP!r})\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _flagged(rank_dir: Path, region: str):
    """(the region's key, its record) for the first split whose `region` the sentinel flagged."""
    from thunderfx_debug import load_report

    report = load_report(rank_dir)
    for graph in report.graphs:
        for split in graph.splits:
            for fusion in split.fusions:
                if fusion.qualified_name == region and fusion.check is not None and fusion.check.mismatched:
                    return f"{graph.name}/{split.name}/{region}", fusion
    flagged = [f"{g.name}/{s.name}/{f.qualified_name}" for g in report.graphs for s in g.splits for f in s.fusions
               if f.check is not None and f.check.mismatched]
    raise SystemExit(f"the sentinel did not flag {region} in {rank_dir}; flagged regions: {flagged or 'none'}")


def _by_command(rank_dir: Path, fusion, budget: float, env: dict[str, str]) -> dict:
    from internals import NotAScript, NotMinimized, TrialRunner, minimize_script

    label = next((k for k in fusion.files if k.startswith("repro_mismatch_")), None)
    if label is None:
        raise SystemExit(f"the region has no mismatch script: {fusion.files}")
    script = rank_dir / fusion.files[label]
    os.environ.update(env)  # the trials' server sees what the training saw
    started = time.perf_counter()
    try:
        with TrialRunner("server") as runner:
            reduction = minimize_script(script, budget, runner=runner)
    except (NotAScript, NotMinimized) as e:
        return {"mismatch_script": fusion.files[label], "error": str(e), "minimize_s": time.perf_counter() - started}
    return {"mismatch_script": fusion.files[label], "ops_before": reduction.ops_before,
            "ops_after": reduction.ops_after, "kept": list(reduction.kept), "trials": reduction.trials,
            "minimize_s": round(time.perf_counter() - started, 1), "budget_spent": reduction.budget_spent,
            "full_piece_verdict": reduction.verdict, "note": reduction.note, "script": reduction.script}


def _at_flush(rank_dir: Path, fusion) -> dict:
    minimized = fusion.minimized
    if minimized is None or minimized.script is None:
        return {"error": "not minimized at flush" + (f": {minimized.note}" if minimized else "")}
    return {"ops_before": minimized.ops_before, "ops_after": minimized.ops_after, "kept": list(minimized.kept),
            "trials": minimized.trials, "minimize_s": minimized.seconds, "budget_spent": minimized.budget_spent,
            "full_piece_verdict": minimized.verdict, "note": minimized.note, "script": rank_dir / minimized.script}


def train_in_child(args, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    command = [sys.executable, __file__, "--train-worker", "--steps", str(args.steps), "--batch", str(args.batch),
               "--out", str(args.out)] + (["--tiny"] if args.tiny else [])
    started = time.perf_counter()
    trained = subprocess.run(command, env=env, capture_output=True, text=True)
    print(trained.stdout[-2000:], trained.stderr[-3000:] if trained.returncode else "", sep="\n", file=sys.stderr)
    return trained, time.perf_counter() - started


def check_minimal(script: Path, found: dict, fusion, args, env: dict[str, str]) -> dict:
    """The minimal script run alone in a fresh interpreter: its verdict, seconds, whether it imports Thunder, and
    `ok` (at most --max-ops ops, the full piece's verdict, no Thunder import in an nvFuser region's script)."""
    from internals import run_script

    run = run_script(script, env=env, timeout_s=600)
    imports_thunder = bool(re.search(r"^\s*(import thunder|from thunder|thunder = import_thunder\(\))",
                                     script.read_text(), re.M))
    full_outcome = found["full_piece_verdict"].split(" (exit")[0].removeprefix("RESULT ").replace(" ", "_")
    return {"minimal_script": str(script.relative_to(args.out)),
            "minimal_verdict_standalone": run.result_line or run.outcome,
            "minimal_standalone_s": round(run.wall_s, 1), "minimal_imports_thunder": imports_thunder,
            "ok": (found["ops_after"] <= args.max_ops and run.outcome == full_outcome
                   and not (fusion.executor == "nvfuser" and imports_thunder))}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.train_worker:
        sys.path.insert(0, str(TESTS))
        train(args)
        return 0
    folder = Path(tempfile.mkdtemp(prefix="thunderfx_debug_minimize_bench_"))
    args.out = args.out or folder / "dump"
    env = _tiny_environment(folder) if args.tiny else dict(os.environ)
    trained, train_s = train_in_child(args, env)

    import thunderfx_debug  # noqa: F401
    from thunderfx_debug import load_report
    from thunderfx_debug.render.minimized import line, minimized_pieces

    rank_dir = args.out / "rank0"
    piece, fusion = _flagged(rank_dir, args.region)
    found = _by_command(rank_dir, fusion, args.budget, env) if args.way == "command" else _at_flush(rank_dir, fusion)
    script = found.pop("script", None)
    results = {
        "machine": "cpu (tiny GPT, a fusion executor with a wrong tanh)" if args.tiny else "cuda (12-layer GPT, nvFuser)",
        "way": args.way, "training_steps": args.steps, "training_s": round(train_s, 1),
        "training_exit_status": trained.returncode, "region": piece, "budget_s": args.budget,
        "max_ops": args.max_ops, "ok": False, **found,
        "all_minimized": [line(p) for p in minimized_pieces(load_report(rank_dir))]}
    if script is not None:
        results.update(check_minimal(script, found, fusion, args, env))
    print(json.dumps(results, indent=1, default=str))
    harness.write_record(args.json, "minimize", results, argv)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
