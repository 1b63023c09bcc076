"""Real models on a CUDA machine: step time and first-step (compile) time of eager, torch.compile (inductor), plain
ThunderFX and ThunderFX under ReportingBackend, side by side in one run, for a 12-layer GPT-style model and a Hugging
Face LlamaForCausalLM built from a config (no downloaded weights).

Each mode runs in its own subprocess (so first-step times include a cold compile and nothing is shared between modes)
from the same seed; the parent prints a table and writes JSON. ReportingBackend runs with its dump, all repro
scripts and fusion-level timing switched on, and the time its flush takes (traces, scripts, files) is measured too.

    source .gpu/setup.sh && python benchmarks/real_models.py --model gpt --steps 60 --json /tmp/gpt.json
    python benchmarks/real_models.py --model llama --steps 60 --json /tmp/llama.json
    python benchmarks/real_models.py --model gpt --tiny --device cpu --steps 4     # smoke test without a GPU

Modes: eager, inductor, thunderfx (thunder.dynamo.ThunderCompiler), reporting (thunderfx_debug.ReportingBackend),
and --thunder-replay times Thunder's own report replay (fx_report + analyze_thunder_splits + create_fusion_reports
on every split) for the same model, for comparison with what ReportingBackend adds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

MODES = ("eager", "inductor", "thunderfx", "reporting")


GPT_LAYERS = int(os.environ.get("REAL_MODELS_GPT_LAYERS", "12"))


def build(model_name: str, tiny: bool, device: str):
    """(model, batches iterator) for a model name, in bf16 on `device` (fp32 on CPU); a batch is what
    `harness.Trainer` takes (the GPT's positional tensors, the Llama's keyword arguments)."""
    import torch

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if model_name == "gpt":
        from thunderfx_debug.commands.models import GPT, GPT_12_LAYER, GPTConfig, synthetic_batches

        config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64) if tiny else dataclasses.replace(GPT_12_LAYER, n_layer=GPT_LAYERS)
        model = GPT(config).to(device=device, dtype=dtype)
        batches = synthetic_batches(config, batch_size=2 if tiny else 8, device=device)
        return model, batches
    if model_name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        if tiny:
            config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
            seq, batch = 64, 2
        else:
            config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                 num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048)
            seq, batch = 1024, 4
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
        generator = torch.Generator().manual_seed(0)

        def batches():
            while True:
                tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
                yield {"input_ids": tokens, "labels": tokens}

        return model, batches()
    raise SystemExit(f"unknown model {model_name!r}; choose gpt or llama")


def run_mode(model_name: str, mode: str, steps: int, tiny: bool, device: str, dump_dir: str) -> dict:
    """Trains `steps` steps in this process and returns timings and losses."""
    import torch

    import thunderfx_debug  # noqa: F401

    model, batches = build(model_name, tiny, device)
    options = harness.thunder_options(device)
    backend = None
    if mode == "eager":
        compiler = None
    elif mode == "inductor":
        compiler = "inductor"
    elif mode == "thunderfx":
        from thunderfx_debug import plain_thunder_compiler

        compiler = plain_thunder_compiler(**options)
    elif mode == "reporting":
        from thunderfx_debug import ReportingBackend

        compiler = backend = ReportingBackend(dump_dir=dump_dir, repro="all", timing="fusion",
                                              timing_every=50 if not tiny else 2, timing_warmup=5 if not tiny else 1,
                                              **options)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    trainer = harness.Trainer(model, compiler, [next(batches) for _ in range(steps)], lr=1e-4, device=device)
    step_s, losses = [], []
    for _ in range(steps):
        loss, ms = trainer.timed_step()
        step_s.append(ms / 1e3)
        losses.append(loss)
    result = {
        "model": model_name,
        "mode": mode,
        "steps": steps,
        "first_step_s": step_s[0],
        "median_step_ms": statistics.median(step_s[min(5, len(step_s) - 1):]) * 1e3,
        "losses": torch.stack(losses).float().cpu().tolist(),
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }
    if backend is not None:
        started = time.perf_counter()
        rank_dir = backend.flush()
        result["flush_s"] = time.perf_counter() - started
        report = backend.report()
        fusions = [f for g in report.graphs for s in g.splits for f in s.fusions]
        result["report"] = {
            "dump": str(rank_dir),
            "graphs": len(report.graphs),
            "thunder_splits": sum(s.kind.value == "thunder" for g in report.graphs for s in g.splits),
            "inductor_splits": [
                {"graph": g.name, "split": s.name, "ops": list(s.ops), "reasons": [f"{r.type}: {r.op}" for r in s.reasons]}
                for g in report.graphs for s in g.splits if s.kind.value == "inductor"
            ],
            "nvfusion_forward": sum(f.name.startswith("nvFusion") and f.phase.value == "forward" for f in fusions),
            "nvfusion_backward": sum(f.name.startswith("nvFusion") and f.phase.value == "backward" for f in fusions),
            "fusions_timed": sum(1 for f in fusions if f.timing is not None and f.timing.count),
            "reporting_failures": report.meta.get("reporting_failures", []),
        }
    return result


def thunder_replay(model_name: str, tiny: bool, device: str) -> dict:
    """Times Thunder's own report path for the same model: fx_report replays the function, analyze_thunder_splits
    splits each graph again, create_fusion_reports recompiles each split to find its fusions."""
    import torch

    import thunderfx_debug  # noqa: F401
    from thunder.dynamo.report import analyze_thunder_splits, fx_report

    model, batches = build(model_name, tiny, device)
    batch = next(batches)
    started = time.perf_counter()
    if isinstance(batch, dict):
        results = fx_report(lambda **b: model(**b).loss)(**batch)
    else:
        results = fx_report(lambda *b: model(*b))(*batch)
    fx_report_s = time.perf_counter() - started
    fusions = 0
    for graph_report in results.fx_graph_reports:
        thunder_report = analyze_thunder_splits(graph_report)
        for split_report in thunder_report.subgraph_reports:
            split_report.create_fusion_reports()
            fusions += len(split_report.fusion_reports)
    total_s = time.perf_counter() - started
    return {"model": model_name, "mode": "thunder_replay", "fx_report_s": fx_report_s, "total_s": total_s,
            "nvfusion_reports": fusions}


def _child(args) -> int:
    if args.mode == "thunder_replay":
        result = thunder_replay(args.model, args.tiny, args.device)
    else:
        result = run_mode(args.model, args.mode, args.steps, args.tiny, args.device, args.dump_dir)
    Path(args.child_json).write_text(json.dumps(result))
    return 0


def _table(results: list[dict]) -> str:
    lines = ["| model | mode | first step (s) | median step (ms) | vs thunderfx | flush (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    by_key = {(r["model"], r["mode"]): r for r in results if "median_step_ms" in r}
    for r in results:
        if "median_step_ms" not in r:
            continue
        base = by_key.get((r["model"], "thunderfx"))
        ratio = f"{r['median_step_ms'] / base['median_step_ms']:.3f}x" if base else "-"
        flush = f"{r['flush_s']:.1f}" if "flush_s" in r else "-"
        lines.append(f"| {r['model']} | {r['mode']} | {r['first_step_s']:.1f} | {r['median_step_ms']:.1f} | {ratio} | {flush} |")
    for r in results:
        if r.get("error"):
            lines.append(f"| {r['model']} | {r['mode']} | failed: {r['error'][:120]} | | | |")
        if r["mode"] == "thunder_replay" and "total_s" in r:
            lines.append(f"| {r['model']} | Thunder report replay | {r['total_s']:.1f} s in all "
                         f"(fx_report {r['fx_report_s']:.1f} s), {r['nvfusion_reports']} fusion reports | | | |")
    return "\n".join(lines)


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


def error_line(stderr: str) -> str:
    """The line of a child's stderr that names its error: the last exception line of the traceback, not the last line
    (torch ends some messages with a line of advice, e.g. a link to the opcheck docs).

    >>> error_line("Traceback (most recent call last):\\n  ...\\nAssertionError: expected size 4==4, stride 4096==32\\n"
    ...            "\\nThis may be an issue with a custom op.\\nSee https://pytorch.org/docs/stable/library.html")
    'AssertionError: expected size 4==4, stride 4096==32'
    >>> error_line("killed")
    'killed'
    """
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (named or lines or ["no output"])[-1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tiny", action="store_true", help="a tiny configuration, for smoke tests")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--thunder-replay", action="store_true", help="also time Thunder's own report replay")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--gpt-layers", type=int, default=12, help="transformer blocks of the GPT (default 12)")
    parser.add_argument("--dump-dir", default=None, help="where ReportingBackend writes (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mode")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_in_child(args, mode: str, dump_dir: str) -> dict:
    """One mode in a subprocess of its own: its results, or its error line and the tail of its stderr."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--model", args.model, "--mode", mode, "--steps", str(args.steps),
                   "--device", args.device, "--dump-dir", dump_dir, "--child-json", out.name]
        command += ["--tiny"] if args.tiny else []
        started = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            failed, stderr = proc.returncode != 0, proc.stderr
            error = error_line(stderr) if failed else None
        except subprocess.TimeoutExpired as timeout:  # its stderr is bytes, whatever `text` says
            failed, error = True, f"timed out after {args.timeout:.0f} s"
            stderr = (timeout.stderr or b"").decode(errors="replace")
        print(f"{args.model} {mode}: {'FAILED ' + error if failed else 'ok'} in {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
        if failed:
            return {"model": args.model, "mode": mode, "error": error, "stderr_tail": stderr.strip().splitlines()[-40:]}
        return json.loads(Path(out.name).read_text())


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode:
        return _child(args)
    dump_dir = args.dump_dir or tempfile.mkdtemp(prefix=f"thunderfx_debug_{args.model}_")
    os.environ["REAL_MODELS_GPT_LAYERS"] = str(args.gpt_layers)  # read by the children
    modes = [m for m in args.modes.split(",") if m] + (["thunder_replay"] if args.thunder_replay else [])
    results = [run_in_child(args, mode, dump_dir) for mode in modes]
    by_mode = {r["mode"]: r for r in results if "losses" in r}
    if "thunderfx" in by_mode and "reporting" in by_mode:
        a, b = by_mode["thunderfx"]["losses"], by_mode["reporting"]["losses"]
        results.append({"model": args.model, "mode": "check", "losses_equal": a == b,
                        "max_loss_difference": max(abs(x - y) for x, y in zip(a, b))})
    print(_table(results))
    for r in results:
        if r["mode"] in ("reporting", "check"):
            print(json.dumps({k: v for k, v in r.items() if k != "losses"}, indent=1))
    harness.write_record(args.json, "real_models", results, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
