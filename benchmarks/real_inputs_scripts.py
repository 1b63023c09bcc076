"""One zoo model at realistic size, trained two steps with the run's own inputs kept (THUNDERFX_DEBUG_INPUTS=real) and
the sentinel on every split call; prints what the sentinel found, then runs the named splits' inductor, eager and
Thunder scripts, each in a fresh interpreter where thunderfx_debug cannot be imported (`standalone.run_script`,
CUDA_LAUNCH_BLOCKING=1), and keeps their output under OUT. It tells a verdict on rebuilt inputs (the scripts', the
triage's) from one on the inputs the run had.

    source .gpu/setup.sh && python benchmarks/real_inputs_scripts.py mixtral $OUT/mixtral thunder_2
    source .gpu/setup.sh && python benchmarks/real_inputs_scripts.py t5-dropout $OUT/t5 thunder_4
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("model", choices=harness.MODELS)
    parser.add_argument("out", type=Path, help="folder for the dump and the scripts' output")
    parser.add_argument("splits", help="comma list of the splits whose scripts run (thunder_2,thunder_4)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=100.0, help="seconds per script")
    args = parser.parse_args(argv)

    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on this torch)
    from thunderfx_debug import ReportingBackend, load_report
    from internals import run_script

    args.out.mkdir(parents=True, exist_ok=True)
    model, batch = harness.build(args.model, "realistic", "cuda", "bfloat16")
    backend = ReportingBackend(dump_dir=args.out / "dump", repro="split", inputs="real", inputs_max_mb=4096,
                               check="split", check_every=1, strict=False)
    harness.train(model, batch, backend, args.steps)
    rank_dir = backend.flush()
    flagged = {f"{g.name}/{s.name}": s.check.to_json() for g in load_report(rank_dir).graphs for s in g.splits
               if s.check is not None and (s.check.mismatches or s.check.failed)}
    print("CHECKS", json.dumps(flagged, indent=1, default=str), flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("THUNDERFX_DEBUG_")}
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    for split in args.splits.split(","):
        for kind in ("inductor", "eager", "thunder"):
            script = rank_dir / "graph0" / f"graph0_{split}" / f"graph0_{split}_repro_{kind}.py"
            if not script.exists():
                continue
            run = run_script(script, timeout_s=args.timeout, env=env)
            text = f"{run.stdout[-3000:]}\n--stderr--\n{run.stderr[-5000:]}\noutcome={run.outcome}"
            print(f"=== {script.name}\n{text}", flush=True)
            (args.out / f"{script.name}.log").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
