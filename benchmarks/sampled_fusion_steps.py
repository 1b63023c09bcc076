"""Fusion timing's sampled steps, one by one: their host time and wall time beside an ordinary step's, and how the
device hold sized its sleeps, on the realistic Llama (`overhead.CUDA_SIZE`, bf16, nvFuser), alone on the device.

    source .gpu/setup.sh && python benchmarks/sampled_fusion_steps.py [--every 10] [--steps 120] [--json PATH]

ReportingBackend(timing="fusion", timing_every=EVERY, timing_warmup=5) trains one copy of the model. Each step is
timed twice: its host time (perf_counter from the step's start to its return, no synchronisation inside: what the
training thread spent queueing it) and its wall time (the device synchronised before and after). After each step
the graph's `DeviceHold` (found with `gc`) says the host time of the last held phases (`_host_ms`, which sizes the
next sleep) and how its sleeps were sized so far (`sleeps`: first, whole, lead). A diagnostic of where a sampled
step's cost lies: in the host's own slowness on the sampled call, or in the device finishing after the host.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import harness
import overhead
from internals import DeviceHold


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=10, help="THUNDERFX_DEBUG_TIMING_EVERY (default 10)")
    parser.add_argument("--steps", type=int, default=120, help="steps after the first (default 120)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device: the hold exists on CUDA only", file=sys.stderr)
        return 2
    from thunderfx_debug import ReportingBackend

    base, batch = harness.build("llama", overhead.CUDA_SIZE, "cuda", "bfloat16", seed=0)
    backend = ReportingBackend(timing="fusion", timing_every=args.every, timing_warmup=5)
    trainer = harness.Trainer(copy.deepcopy(base), backend, [batch], lr=1e-4)
    started = time.perf_counter()
    trainer.step()
    torch.cuda.synchronize()
    print(f"first step (compile) {time.perf_counter() - started:.1f} s", flush=True)
    holds = [o for o in gc.get_objects() if type(o) is DeviceHold]  # type(): no weak proxy dereferenced
    hold = holds[0] if holds else None
    rows = []
    for call in range(2, args.steps + 2):
        torch.cuda.synchronize()
        started = time.perf_counter()
        trainer.step()
        host = (time.perf_counter() - started) * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - started) * 1e3
        sampled = call > 5 and (call - 6) % args.every == 0
        rows.append({"call": call, "sampled": sampled, "host_ms": host, "wall_ms": wall,
                     "phase_host_ms": {k.value: v for k, v in hold._host_ms.items()} if hold else None,
                     "sleeps": copy.deepcopy(hold.sleeps) if hold else None})
    ordinary = [r for r in rows if not r["sampled"]]
    summary = {"ordinary_host_ms_median": statistics.median(r["host_ms"] for r in ordinary),
               "ordinary_wall_ms_median": statistics.median(r["wall_ms"] for r in ordinary),
               "sampled_host_ms": [round(r["host_ms"], 2) for r in rows if r["sampled"]],
               "sampled_wall_ms": [round(r["wall_ms"], 2) for r in rows if r["sampled"]],
               "sleeps": rows[-1]["sleeps"]}
    print(json.dumps(summary, indent=1))
    for r in rows:
        if r["sampled"]:
            print(f"call {r['call']}: host {r['host_ms']:.2f} ms, wall {r['wall_ms']:.2f} ms, phases' host "
                  f"{r['phase_host_ms']}")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "sampled_fusion_steps", "command": " ".join(sys.argv),
                                         "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
