"""Where each fusion comes from, on a real model: a Hugging Face model of the zoo trained under ReportingBackend, and
every fusion region, op group and split of its dump checked for the lines of the model's code it names. The check is
made against the model's modeling file, read here: each forward region that fuses an `rsqrt` (an RMSNorm) must name a
line of that file that calls `torch.rsqrt`.

    source .gpu/setup.sh && python benchmarks/provenance.py --model llama --size realistic --device cuda \\
        --dtype bfloat16 --steps 3 --json benchmarks/results/provenance_h200_llama.json   # nvFuser's regions, one H200
    python benchmarks/provenance.py --model llama --size tiny --device cpu --steps 2   # CPU: the torch.compile executor

Prints, and writes with --json: per phase, the regions that name their lines (and the op groups, with fusion-level
timing every call); for the backward, apart, those that name the forward lines that made the saved values they read
(`reads_saved_from`), those named by these alone, and those that name no line; each forward rsqrt region with the
lines it names; the groups of regions that repeat the same
lines and ops (one per layer: "the same lines in 4 regions"); and what the flush took, sources and all. Exit status 1
where a forward rsqrt region does not name the rsqrt line, or no forward region fuses an rsqrt.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def rsqrt_lines(path: str) -> list[int]:
    """The lines of a file that call torch.rsqrt, read here (not by the tool)."""
    return [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if "torch.rsqrt(" in line]


def named_counts(kind: str, pieces: list) -> dict[str, int]:
    """How many of `pieces` name lines: by their own ops' lines (`sources`), by the lines that made the saved values
    they read (`reads_saved_from`, backward pieces), by those alone, and by neither."""
    return {kind: len(pieces),
            f"{kind}_with_sources": sum(bool(p.sources) for p in pieces),
            f"{kind}_reading_saved_values": sum(bool(p.reads_saved_from) for p in pieces),
            f"{kind}_named_by_saved_values_only": sum(bool(p.reads_saved_from and not p.sources) for p in pieces),
            f"{kind}_naming_no_line": sum(not (p.sources or p.reads_saved_from) for p in pieces)}


def check(model: str, size: str, device: str, dtype: str, steps: int, dump: Path, executors: str | None) -> dict:
    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on this torch)
    import torch

    from thunderfx_debug import ReportingBackend, load_report
    from thunderfx_debug.records import SourceLine
    from thunderfx_debug.render import provenance

    if device == "cpu":
        torch.set_num_threads(1)
    net, batch = harness.build(model, size, device, dtype)
    modeling = sys.modules[type(net).__module__].__file__
    lines = rsqrt_lines(modeling)
    backend = ReportingBackend(dump_dir=dump, timing="fusion", timing_every=1, timing_warmup=1, repro="fusion",
                               strict=True, **harness.thunder_options(device, executors))
    harness.train(net, batch, backend, steps)
    started = time.perf_counter()
    rank_dir = backend.flush()
    flush_s = time.perf_counter() - started
    report = load_report(rank_dir)
    splits = [(f"{g.name}/{s.name}", s) for g in report.graphs for s in g.splits]
    regions = [(f"{path}/{f.name}", f) for path, s in splits for f in s.fusions]
    counts = {}
    for phase in ("forward", "backward"):
        chosen = [f for _, f in regions if f.phase.value == phase]
        groups = [g for _, s in splits for g in s.op_groups if g.phase.value == phase and g.symbol != "between ops"]
        counts[phase] = {**named_counts("regions", chosen), **named_counts("op_groups", groups)}
    norms = []
    for path, fusion in regions:
        if fusion.phase.value == "forward" and "rsqrt" in fusion.ops:
            named = [SourceLine.parse(s) for s in fusion.sources]
            names_it = any(n is not None and n.file == modeling and n.line in lines for n in named)
            norms.append({"region": path, "executor": fusion.executor, "names_the_rsqrt_line": names_it,
                          "sources": list(fusion.sources[:6])})
    repeated = [{"regions": g.count, "phase": g.phase, "executor": g.executor, "ops": len(g.ops),
                 "sources": list(g.sources[:4]), "reads_saved_from": list(g.reads_saved_from[:4]),
                 "ms_per_step": g.ms_per_step}
                for g in provenance.repeated_regions(report)]
    return {"model": model, "size": size, "device": device, "dtype": dtype, "steps": steps, "dump": str(rank_dir),
            "modeling_file": modeling, "rsqrt_lines": lines, "counts": counts, "rsqrt_regions": norms,
            "splits_with_sources": sum(bool(s.sources) for _, s in splits), "splits": len(splits),
            "repeated": repeated, "flush_s": round(flush_s, 2),
            "ok": bool(norms) and all(n["names_the_rsqrt_line"] for n in norms)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama", choices=harness.MODELS)
    parser.add_argument("--size", default="tiny", choices=sorted(harness.SIZES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--executors", default=None, help="Thunder's executors by name (default: the harness's)")
    parser.add_argument("--dump", type=Path, default=None, help="the dump directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    import tempfile

    args = parse_args(argv)
    dump = args.dump or Path(tempfile.mkdtemp(prefix="provenance_"))
    results = check(args.model, args.size, args.device, args.dtype, args.steps, dump, args.executors)
    print(f"{args.model} ({args.size}, {args.device}): dump {results['dump']}; flush {results['flush_s']} s")
    for phase, c in results["counts"].items():
        print(f"  {phase}: {c['regions_with_sources']} of {c['regions']} regions name their lines, "
              f"{c['op_groups_with_sources']} of {c['op_groups']} op groups")
        if phase == "backward":
            for kind, label in (("regions", "regions"), ("op_groups", "op groups")):
                print(f"    {label}: {c[f'{kind}_reading_saved_values']} name the lines that saved values they read, "
                      f"{c[f'{kind}_named_by_saved_values_only']} by those alone; {c[f'{kind}_naming_no_line']} "
                      "name no line")
    print(f"  splits: {results['splits_with_sources']} of {results['splits']} name their lines")
    print(f"  torch.rsqrt in {results['modeling_file']} at lines {results['rsqrt_lines']}")
    for norm in results["rsqrt_regions"]:
        print(f"  {'ok  ' if norm['names_the_rsqrt_line'] else 'MISS'} {norm['region']} ({norm['executor']}): "
              + ", ".join(norm["sources"][:3]))
    for group in results["repeated"][:10]:
        saved = f"; reads values saved at {', '.join(group['reads_saved_from'][:2])}" if group["reads_saved_from"] else ""
        print(f"  the same lines in {group['regions']} regions ({group['phase']}, {group['executor']}, "
              f"{group['ops']} ops): " + ", ".join(group["sources"][:2]) + saved)
    print("OK: every forward rsqrt region names the rsqrt line" if results["ok"] else
          "FAILED: a forward rsqrt region does not name the rsqrt line, or none fuses an rsqrt")
    harness.write_record(args.json, "provenance", results)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
