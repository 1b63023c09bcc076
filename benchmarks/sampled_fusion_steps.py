"""Fusion timing's sampled steps, one by one: their host time and wall time beside an ordinary step's, and how the
device hold sized its sleeps, on the realistic Llama or the Mixtral (`overhead.CUDA_SIZE`, bf16, nvFuser), alone
on the device.

    source .gpu/setup.sh && python benchmarks/sampled_fusion_steps.py [--model llama] [--every 10] [--steps 120]
        [--margins "1.25,0.1;1.05,0.03"] [--json PATH]

ReportingBackend(timing="fusion", timing_every=EVERY, timing_warmup=5) trains one copy of the model. Each step is
timed twice: its host time (perf_counter from the step's start to its return, no synchronisation inside: what the
training thread spent queueing it) and its wall time (the device synchronised before and after). After each step
the graph's `DeviceHold` (found with `gc`) says the host time of the last held phases (`_host_ms`, which sizes the
next sleep) and how its sleeps were sized so far (`sleeps`: first, whole, lead). A diagnostic of where a sampled
step's cost lies: in the host's own slowness on the sampled call, or in the device finishing after the host.

`--margins` asks what the hold's margins (`DeviceHold.FACTOR` on the lead, `SPARE` of the phase's host time) cost
and what they buy: the sampled calls take the given (FACTOR, SPARE) pairs in turn (set on the holds before each
sampled step), in one copy of the model, so that the settings are paired over the same steps. Per setting: the
sampled steps' wall time over the median of the ordinary steps around them (what the sleep and the marks cost),
how often a call of that setting left a lead the hold could not use (a span the device may have reached before its
end was queued: the sleep was too short, and the next sleep is sized by the whole host time), and each region's
median against the first setting's (a sleep too short lets the device wait inside a span, which times the wait).
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
from internals import DeviceHold, RegionTimer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=10, help="THUNDERFX_DEBUG_TIMING_EVERY (default 10)")
    parser.add_argument("--steps", type=int, default=120, help="steps after the first (default 120)")
    parser.add_argument("--model", choices=("llama", "mixtral"), default="llama", help="(default llama)")
    parser.add_argument("--margins", type=_margins, default=None,
                        help="(FACTOR, SPARE) pairs the sampled calls take in turn: \"1.25,0.1;1.05,0.03\" "
                             "(default: the hold's own)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device: the hold exists on CUDA only", file=sys.stderr)
        return 2
    from thunderfx_debug import ReportingBackend

    base, batch = harness.build(args.model, overhead.CUDA_SIZE, "cuda", "bfloat16", seed=0)
    backend = ReportingBackend(timing="fusion", timing_every=args.every, timing_warmup=5)
    trainer = harness.Trainer(copy.deepcopy(base), backend, [batch], lr=1e-4)
    started = time.perf_counter()
    trainer.step()
    torch.cuda.synchronize()
    print(f"first step (compile) {time.perf_counter() - started:.1f} s", flush=True)
    holds = [o for o in gc.get_objects() if type(o) is DeviceHold]  # type(): no weak proxy dereferenced
    hold = holds[0] if holds else None
    margins = args.margins or [(DeviceHold.FACTOR, DeviceHold.SPARE)]
    rows = []
    for call in range(2, args.steps + 2):
        setting = ((call - 6) // args.every) % len(margins) if call > 5 else None
        for each in holds:
            each.FACTOR, each.SPARE = margins[setting or 0]
        torch.cuda.synchronize()
        started = time.perf_counter()
        trainer.step()
        host = (time.perf_counter() - started) * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - started) * 1e3
        sampled = call > 5 and (call - 6) % args.every == 0
        rows.append({"call": call, "sampled": sampled, "host_ms": host, "wall_ms": wall,
                     "setting": setting if sampled else None,
                     "phase_host_ms": {k.value: v for k, v in hold._host_ms.items()} if hold else None,
                     "sleeps": copy.deepcopy(hold.sleeps) if hold else None,
                     "held": dict(hold._held) if hold and sampled else None})
    margins_summary = None
    if args.margins:
        try:
            margins_summary = _margins_summary(rows, margins)
        except Exception:  # a diagnostic: the rows still go out
            import traceback
            traceback.print_exc()
    for r in rows:
        r.pop("held")
    ordinary = [r for r in rows if not r["sampled"]]
    summary = {"ordinary_host_ms_median": statistics.median(r["host_ms"] for r in ordinary),
               "ordinary_wall_ms_median": statistics.median(r["wall_ms"] for r in ordinary),
               "sampled_host_ms": [round(r["host_ms"], 2) for r in rows if r["sampled"]],
               "sampled_wall_ms": [round(r["wall_ms"], 2) for r in rows if r["sampled"]],
               "sleeps": rows[-1]["sleeps"]}
    if args.margins:
        summary["margins"] = margins_summary
    print(json.dumps(summary, indent=1))
    for r in rows:
        if r["sampled"]:
            print(f"call {r['call']}: host {r['host_ms']:.2f} ms, wall {r['wall_ms']:.2f} ms, phases' host "
                  f"{r['phase_host_ms']}")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "sampled_fusion_steps", "command": " ".join(sys.argv),
                                         "summary": summary, "rows": rows}, indent=1))
    return 0


def _margins(text: str) -> list[tuple[float, float]]:
    try:
        pairs = [tuple(float(x) for x in pair.split(",")) for pair in text.split(";")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or p[0] < 1 or p[1] < 0 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give FACTOR,SPARE pairs separated by ';', FACTOR >= 1, "
                                         "SPARE >= 0, e.g. \"1.25,0.1;1.05,0.03\"")
    return pairs


def _margins_summary(rows: list[dict], margins: list[tuple[float, float]]) -> list[dict]:
    """Per (FACTOR, SPARE) setting: the sampled steps' excess wall time, the holds' sleeps and the leads their calls
    left, and each region's median against the first setting's (the regions' samples split by their call)."""
    timers = [o for o in gc.get_objects() if type(o) is RegionTimer]
    for timer in timers:
        timer.resolve(wait=True)  # every trace read: its lead is on its held phase
    by_call = {r["call"]: r for r in rows}
    setting_of = {r["call"]: r["setting"] for r in rows if r["sampled"]}
    region_medians: list[dict[str, float]] = [{} for _ in margins]
    for timer in timers:
        for key, series in timer.series.items():
            split: list[list[float]] = [[] for _ in margins]
            for call, ms in zip(series.calls, series.samples_ms):
                if call in setting_of:
                    split[setting_of[call]].append(ms)
            for i, samples in enumerate(split):
                if samples:
                    region_medians[i][f"{id(timer)}/{key}"] = statistics.median(samples)
    out = []
    for i, (factor, spare) in enumerate(margins):
        calls = [r for r in rows if r["setting"] == i]
        excess, slept, leads, unusable = [], [], [], 0
        for r in calls:
            around = [by_call[c]["wall_ms"] for c in range(r["call"] - 3, r["call"] + 4)
                      if c in by_call and not by_call[c]["sampled"] and c > 5]
            if around:
                excess.append(r["wall_ms"] - statistics.median(around))
            for held in (r["held"] or {}).values():
                if held.slept_ms is not None:
                    slept.append(held.slept_ms)
                if held.leads and None not in held.leads and len(held.leads) == held.traces:
                    leads.append(max(held.leads))
                else:
                    unusable += 1
        ratios = sorted(region_medians[i][k] / region_medians[0][k] for k in region_medians[i]
                        if k in region_medians[0] and region_medians[0][k] > 0)
        out.append({
            "factor": factor, "spare": spare, "sampled_steps": len(calls),
            "excess_wall_ms_median": statistics.median(excess) if excess else None,
            "excess_wall_ms_mean": statistics.fmean(excess) if excess else None,
            "slept_ms_mean": statistics.fmean(slept) if slept else None,
            "lead_ms_mean": statistics.fmean(leads) if leads else None,
            "held_phases_without_a_usable_lead": unusable,
            "held_phases": sum(len(r["held"] or {}) for r in calls),
            "regions_compared": len(ratios),
            "region_median_ratio_to_first": {
                "median": statistics.median(ratios) if ratios else None,
                "p90": ratios[int(0.9 * (len(ratios) - 1))] if ratios else None,
                "above_1.05": sum(r > 1.05 for r in ratios)},
        })
    return out


if __name__ == "__main__":
    sys.exit(main())
