"""Whole-model flush-time triage (THUNDERFX_DEBUG_TRIAGE=fusion) of real models, with the reconciliation against
end-to-end step times: for each model, an inductor run (torch.compile) and a ReportingBackend run with triage on, the
same steps from the same seed, step time measured around each step (device synchronised: this is a benchmark); then
the flush, which times every Thunder split and fusion region against inductor's compile of the same piece.

    source .gpu/setup.sh && python benchmarks/triage.py --json $OUT/triage.json          # H200: Llama 8 layers, GPT 12
    python benchmarks/triage.py --device cpu --tiny --models gpt --steps 4                 # smoke test without a GPU

Models (from benchmarks/real_models.py): `llama`, a Hugging Face LlamaForCausalLM from a config (8 layers, hidden 1024,
bf16) with Thunder's default executors (nvFuser); `gpt`, the 12-layer GPT of thunderfx_debug.models with Thunder's
torch.compile executor first (TorchCompileN regions). Prints per model: the flush's time (the triage is most of it),
the top deviating pieces, and the totals: the splits' summed gain or loss per step against inductor beside the
measured difference of the median ThunderFX step and the median inductor step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,gpt", help="comma list of llama, gpt (default: both)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20; 5 warm-up)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small models (CPU smoke test)")
    parser.add_argument("--level", default="fusion", choices=("split", "fusion"))
    parser.add_argument("--inputs", default="real", choices=("real", "meta"),
                        help="the pieces' inputs for the triage: the run's tensors (default; up to 4 GB per piece) or "
                             "rebuilt from their metadata")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no further model after this many seconds (a lent machine's limit)")
    parser.add_argument("--json", help="write the figures here")
    return parser.parse_args(argv)


def _train(compiled, model, batches, loss_fn, steps: int, device: str) -> list[float]:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step_ms = []
    for _ in range(steps):
        batch = next(batches)
        sync()
        started = time.perf_counter()
        loss = loss_fn(compiled, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        step_ms.append((time.perf_counter() - started) * 1e3)
    return step_ms


def _executors(name: str, device: str):
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    if name == "gpt" or device != "cuda":
        return [torch_compile_ex, *thunder.get_default_executors()]
    return thunder.get_default_executors()


def run_model(name: str, args) -> dict:
    import torch

    import thunderfx_debug
    from real_models import build
    from thunderfx_debug import ReportingBackend, load_report
    from thunderfx_debug.render import flush_triage

    warm = min(5, max(args.steps - 2, 0))
    model, batches, loss_fn = build(name, args.tiny, args.device)
    started = time.perf_counter()
    inductor_steps = _train(torch.compile(model), model, batches, loss_fn, args.steps, args.device)
    inductor_wall = time.perf_counter() - started
    del model
    torch._dynamo.reset()
    model, batches, loss_fn = build(name, args.tiny, args.device)
    dump = tempfile.mkdtemp(prefix=f"triage_{name}_")
    backend = ReportingBackend(dump, triage=args.level, flush_every=0, inputs=args.inputs, inputs_max_mb=4096,
                               executors=_executors(name, args.device))
    started = time.perf_counter()
    thunder_steps = _train(torch.compile(model, backend=backend), model, batches, loss_fn, args.steps, args.device)
    thunder_wall = time.perf_counter() - started
    started = time.perf_counter()
    rank_dir = backend.flush()
    flush_s = time.perf_counter() - started
    started = time.perf_counter()
    backend.flush()  # the triage is kept: a second flush times nothing again
    second_flush_s = time.perf_counter() - started
    report = load_report(rank_dir)
    pieces = flush_triage.triaged_pieces(report)
    totals = flush_triage.totals(report)
    inductor_ms = statistics.median(inductor_steps[warm:])
    thunder_ms = statistics.median(thunder_steps[warm:])
    top = [{"piece": p.path, "level": p.level, "executor": p.executor, "thunder_ms": p.triage.thunder_ms,
            "inductor_ms": p.triage.inductor_ms, "ratio": p.triage.ratio, "ratio_low": p.triage.ratio_low,
            "ratio_high": p.triage.ratio_high, "ms_per_step": p.triage.ms_per_step, "deviates": p.triage.deviates,
            "clock": p.triage.clock.value, "inputs": p.triage.inputs, "scripts": list(p.scripts)}
           for p in pieces if p.triage.error is None]
    failed = [{"piece": p.path, "error": p.triage.error} for p in pieces if p.triage.error is not None]
    result = {
        "model": name, "tiny": args.tiny, "device": args.device, "level": args.level, "steps": args.steps,
        "inductor_step_ms": inductor_ms, "thunderfx_step_ms": thunder_ms,
        "measured_difference_ms": thunder_ms - inductor_ms,
        "triage_lost_ms": totals.lost_ms, "triage_gained_ms": totals.gained_ms, "triage_net_ms": totals.net_ms,
        "flush_s": flush_s, "second_flush_s": second_flush_s, "inductor_run_s": inductor_wall,
        "thunderfx_run_s": thunder_wall, "pieces": len(pieces), "deviating": sum(p["deviates"] for p in top),
        "not_judged": failed, "ranked": top, "dump": str(rank_dir),
        "splits": sum(p.level == "split" for p in pieces), "regions": sum(p.level == "fusion" for p in pieces),
    }
    print(f"\n== {name}: flush with triage {flush_s:.1f} s ({result['splits']} splits, {result['regions']} regions, "
          f"{result['deviating']} deviate, {len(failed)} not judged); second flush {second_flush_s:.1f} s")
    print(f"   step: ThunderFX {thunder_ms:.3f} ms, inductor {inductor_ms:.3f} ms, measured difference "
          f"{thunder_ms - inductor_ms:+.3f} ms; triage: splits lose {totals.lost_ms:.3f} ms and gain "
          f"{-totals.gained_ms:.3f} ms per step, net {totals.net_ms:+.3f} ms")
    for p in top[:8]:
        print(f"   {p['piece']:55s} {p['ratio']:7.2f}x [{p['ratio_low']:.2f}, {p['ratio_high']:.2f}] "
              f"{p['ms_per_step']:+8.3f} ms/step {'DEVIATES' if p['deviates'] else ''}")
    for f in failed[:5]:
        print(f"   not judged: {f['piece']}: {f['error'][:200]}")
    del backend, model
    torch._dynamo.reset()
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    import thunderfx_debug  # noqa: F401  (before thunder)

    results = []
    started = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if args.deadline_s is not None and time.perf_counter() - started > args.deadline_s:
            print(f"\n== {name}: skipped, past --deadline-s {args.deadline_s:g}")
            results.append({"model": name, "skipped": f"past --deadline-s {args.deadline_s:g}"})
            continue
        results.append(run_model(name, args))
        if args.json:  # after each model: a run cut short keeps what it measured
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
