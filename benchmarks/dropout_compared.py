"""Dropout compared: of the pieces of the dropout zoo models that draw random numbers, how many the correctness
sentinel and the scripts compared (OK or MISMATCH) and how many they could not (and why), read from a dump that
`zoo.py` wrote and verified with the sentinel on (`--check fusion`).

    source .gpu/setup.sh && python benchmarks/zoo.py --device cuda --size realistic --dtype bfloat16 \\
        --models gpt2-dropout,t5-dropout --check fusion --steps 2 --jobs 8 --dump /tmp/dz --json $OUT/zoo_dropout.json
    python benchmarks/dropout_compared.py --dump /tmp/dz --zoo-json $OUT/zoo_dropout.json --json $OUT/dropout.json

A fusion region draws where its ops include `uniform_philox` (Thunder's dropout) or another random op; a split draws
where its check or its scripts name random ops. The sentinel compared a drawing piece where it compared values on
its checked calls and skipped none for its random ops; a script compared it where its verdict is OK or MISMATCH.
Targets (issue 58): 90 % of the drawing regions compared, sentinel and scripts alike; NOT COMPARABLE under 10 % of
each model's scripts.

`--cost` instead measures what drawing again adds to a checked call: per dropout of a realistic model, one
`nvfuser_uniform` of its shape (what the reference draws), against `torch.rand` of the same shape (what eager's own
dropout draws) and the dropout itself, with torch.utils.benchmark on `--device`:

    source .gpu/setup.sh && python benchmarks/dropout_compared.py --cost --device cuda --json $OUT/dropout_cost.json

`--planted` instead trains a dropout on a hidden activation through each of the tests' executors of their own
(tests/dropout_executors.py: the right F.dropout, one that scales by 1.01 / (1 - p), one that drops 1.5 p) in
bfloat16 and float32 on `--device`, under CHECK=split on every call, and prints how far the sentinel found each from
its reference: the worst value's fraction of what is allowed (above 1 a MISMATCH):

    python benchmarks/dropout_compared.py --planted --device cpu --json planted_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from thunderfx_debug import load_report  # noqa: E402

RANDOM_OPS = {"uniform_philox", "uniform", "philox_rand", "bernoulli", "randn", "rand", "dropout"}


def _random_skip(check) -> list[str]:
    return [r for r in (check.skipped if check is not None else ()) if "random" in r]


def model_figures(rank_dir: Path, rows: list[dict]) -> dict:
    report = load_report(rank_dir)
    verdict_of = {Path(r["path"]).name: r["verdict"] for r in rows}
    regions = {"drawing": 0, "sentinel_compared": 0, "sentinel_not": Counter(), "scripts": Counter()}
    splits = {"drawing": 0, "sentinel_compared": 0, "sentinel_not": Counter(), "scripts": Counter()}

    def count(part: dict, piece) -> None:
        part["drawing"] += 1
        skipped = _random_skip(piece.check)
        if piece.check is not None and piece.check.compared and not skipped:
            part["sentinel_compared"] += 1
        else:
            part["sentinel_not"][(skipped or ["not checked"])[0][:160]] += 1
        for label, path in piece.files.items():
            if label.startswith("repro_"):
                part["scripts"][verdict_of.get(Path(path).name, "NOT_VERIFIED")] += 1

    for graph in report.graphs:
        for split in graph.splits:
            for fusion in split.fusions:
                if RANDOM_OPS & set(fusion.ops):
                    count(regions, fusion)
            scripts = [(rank_dir / p).read_text() for label, p in split.files.items()
                       if label.startswith("repro_") and (rank_dir / p).is_file()]
            if _random_skip(split.check) or any("random_ops=('" in t or "draws='" in t for t in scripts):
                count(splits, split)
    every = Counter(r["verdict"] for r in rows)
    for part in (regions, splits):
        part["sentinel_not"] = dict(part["sentinel_not"])
        part["scripts"] = dict(part["scripts"])
    return {"regions": regions, "splits": splits, "all_scripts": dict(every),
            "not_comparable_share": round(every.get("NOT_COMPARABLE", 0) / max(1, sum(every.values())), 4)}


def _share(part: dict) -> str:
    scripts = part["scripts"]
    compared = scripts.get("OK", 0) + scripts.get("MISMATCH", 0)
    return (f"{part['sentinel_compared']} of {part['drawing']} | {compared} of {sum(scripts.values())} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(scripts.items()))})")


#: Dropout shapes of the realistic zoo (batch 4, sequence 512, hidden 768, 12 heads): the hidden states' and eager
#: attention's probabilities'.
COST_SHAPES = ((4, 512, 768), (4, 12, 512, 512))


def cost(device: str) -> dict:
    import torch
    import torch.utils.benchmark as benchmark

    from internals import nvfuser_uniform

    figures = {}
    for shape in COST_SHAPES:
        x = torch.randn(shape, device=device, dtype=torch.bfloat16)
        timers = {
            "nvfuser_uniform": lambda: nvfuser_uniform(shape, 1234, 7, torch.bfloat16, device),
            "torch.rand": lambda: torch.rand(shape, device=device, dtype=torch.bfloat16),
            "F.dropout": lambda: torch.nn.functional.dropout(x, 0.1),
        }
        row = {}
        for name, fn in timers.items():
            measured = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=1.0)
            row[name] = round(measured.median * 1e3, 4)
        row["nvfuser_uniform / torch.rand"] = round(row["nvfuser_uniform"] / row["torch.rand"], 2)
        figures["x".join(map(str, shape))] = row
        print(f"{shape} on {device}, median ms: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return figures


def planted(device: str) -> dict:
    import torch

    from thunderfx_debug import ReportingBackend

    # The tests' planted executors (a user's executor's stand-ins, registered on import) and their model.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import thunder
    import dropout_executors

    figures = {}
    for name in ("right_dropout_ex", "wrong_scale_dropout_ex", "wrong_fraction_dropout_ex"):
        for dtype in (torch.bfloat16, torch.float32):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = dropout_executors.DroppedHidden().to(device=device, dtype=dtype)
            backend = ReportingBackend(check="split", check_every=1,
                                       executors=[getattr(dropout_executors, name), *thunder.get_default_executors()])
            compiled = torch.compile(model, backend=backend)
            for _ in range(2):
                compiled(torch.randn(16, 32, device=device, dtype=dtype)).backward()
            check = next(s.check for g in backend.report().graphs for s in g.splits if s.check is not None)
            row = {"compared": check.compared, "mismatches": check.mismatches, "worst": check.worst_output,
                   "worst_ratio": round(check.worst_ratio, 3) if check.worst_ratio is not None else None}
            figures[f"{name} {str(dtype).removeprefix('torch.')}"] = row
            print(f"{name} {dtype} on {device}: {row}")
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", type=Path, help="zoo.py's --dump")
    parser.add_argument("--zoo-json", type=Path, help="zoo.py's --json (the scripts' verdicts)")
    parser.add_argument("--cost", action="store_true", help="measure the draws' cost instead (see above)")
    parser.add_argument("--planted", action="store_true", help="the planted wrong dropouts instead (see above)")
    parser.add_argument("--device", default="cpu", help="--cost, --planted: the device (default cpu)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.cost:
        harness.write_record(args.json, "dropout_cost", cost(args.device), argv)
        return 0
    if args.planted:
        harness.write_record(args.json, "dropout_planted", planted(args.device), argv)
        return 0
    if args.dump is None or args.zoo_json is None:
        parser.error("--dump and --zoo-json are needed (or --cost, or --planted)")
    zoo = json.loads(args.zoo_json.read_text())
    zoo = zoo.get("results", zoo)
    figures = {}
    for model in sorted({r["model"] for r in zoo["scripts"]}):
        figures[model] = model_figures(args.dump / model / "rank0", [r for r in zoo["scripts"] if r["model"] == model])
    print("| model | drawing regions: sentinel compared \\| scripts compared | drawing splits: sentinel \\| scripts "
          "| NOT COMPARABLE of all scripts |")
    print("| --- | --- | --- | --- |")
    for model, f in figures.items():
        print(f"| {model} | {_share(f['regions'])} | {_share(f['splits'])} | {f['not_comparable_share']:.1%} |")
    for model, f in figures.items():
        for part in ("regions", "splits"):
            for reason, count in f[part]["sentinel_not"].items():
                print(f"{model} {part} not compared by the sentinel ({count}): {reason}")
    harness.write_record(args.json, "dropout_compared", figures, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
