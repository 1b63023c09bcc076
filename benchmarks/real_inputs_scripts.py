"""One zoo model at realistic size with the run's own inputs (THUNDERFX_DEBUG_INPUTS=real) and the sentinel on every
split call: prints what the sentinel found, then runs the named splits' inductor, eager and Thunder scripts, each in a
fresh interpreter with CUDA_LAUNCH_BLOCKING=1, and keeps their output. It tells a verdict of the scripts (or the
triage's) on rebuilt inputs from one on the inputs the run had.

    source .gpu/setup.sh && python benchmarks/real_inputs_scripts.py mixtral $OUT/mixtral thunder_2
    source .gpu/setup.sh && python benchmarks/real_inputs_scripts.py t5-dropout $OUT/t5 thunder_4
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thunderfx_debug  # noqa: F401,E402  (first: the workaround `import thunder` needs on this torch)
import harness  # noqa: E402
from thunderfx_debug import ReportingBackend, load_report  # noqa: E402

out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
name = sys.argv[1]
model, batch = harness.build(name, "realistic", "cuda", "bfloat16")
backend = ReportingBackend(dump_dir=out / "dump", repro="split", inputs="real", inputs_max_mb=4096, check="split",
                           check_every=1, strict=False)
losses = harness.train(model, batch, backend, 2)
rank_dir = backend.flush()
report = load_report(rank_dir)
facts = {}
for g in report.graphs:
    for s in g.splits:
        if s.check is not None and (s.check.mismatches or s.check.failed):
            facts[f"{g.name}/{s.name}"] = s.check.to_json() if hasattr(s.check, "to_json") else str(s.check)
print("CHECKS", json.dumps(facts, indent=1, default=str)[:20000], flush=True)
wanted = sys.argv[3].split(",")
env = {k: v for k, v in os.environ.items() if not k.startswith("THUNDERFX_DEBUG_")}
env["CUDA_LAUNCH_BLOCKING"] = "1"
for split in wanted:
    folder = rank_dir / "graph0" / f"graph0_{split}"
    for kind in ("inductor", "eager", "thunder"):
        script = folder / f"graph0_{split}_repro_{kind}.py"
        if not script.exists():
            continue
        started = time.time()
        try:
            done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100, env=env,
                                  cwd="/tmp")
            text = done.stdout[-3000:] + "\n--stderr--\n" + done.stderr[-5000:] + f"\nrc={done.returncode}"
        except subprocess.TimeoutExpired:
            text = "TIMEOUT"
        print(f"=== {script.name} ({time.time() - started:.0f} s)\n{text}", flush=True)
        (out / f"{script.name}.log").write_text(text)
for f in (rank_dir / "summary.md",):
    if f.exists():
        (out / "summary.md").write_text(f.read_text())
