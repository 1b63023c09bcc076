"""Which part of Thunder makes the GPT crash on the H200? Trains the GPT under plain ThunderCompiler (no
ReportingBackend anywhere), one executor set per child process, and prints per step what happened.

    source .gpu/setup.sh && python3 benchmarks/gpt_crash_probe.py --layers 4 --variants default,no-nvfuser,no-sdpa

Found on the H200 in the second session: a GPT of 4 or more layers dies with "CUDA error: an illegal memory access"
in its first steps under plain ThunderCompiler; 2 layers train. Each variant runs in its own process, because a CUDA
error poisons the context of the process it happens in. Set CUDA_LAUNCH_BLOCKING=1 to name the failing kernel.
Settings of the environment reach the children, e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (found in the
fourth session: the 4-layer GPT then trains, while the 12-layer one computes wrong losses; see RESULTS.md).
The fifth session found the cause below Thunder: this nvFuser build overwrites memory it does not own
(benchmarks/nvfuser_memory_probe.py, with nvFuser and torch alone).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback

VARIANTS = {
    "default": lambda names: names,
    "no-nvfuser": lambda names: [n for n in names if n != "nvfuser"],
    "no-sdpa": lambda names: [n for n in names if n not in ("sdpa", "cudnn")],
    # nvFuser for everything but the embedding lookup (the op of the region that crashed, nvFusion0): see
    # _without_nvfuser_embedding. A benchmark-side experiment; the backend never changes Thunder's choices. Found:
    # it crashes the same way at 4 and 12 layers, so the lookup is not the cause.
    "no-nvfuser-embedding": lambda names: names,
    "torch-only": lambda names: [n for n in names if n not in ("nvfuser", "sdpa", "cudnn", "torchcompile_cat", "torchcompile_xentropy")],
}


def _without_nvfuser_embedding() -> None:
    """Makes nvFuser decline `embedding` (Thunder 0.2.6 claims it for nvFuser >= 0.2.25 as an index_select), so the
    torch executor runs the lookup and nvFuser fuses the rest."""
    import thunder
    import thunder.torch as ltorch
    from thunder.core.prims import PrimIDs

    nvfuser = thunder.extend.get_executor("nvfuser")
    for op in (PrimIDs.EMBEDDING, ltorch.embedding.id):
        nvfuser.implmap[op].checker = lambda *args, **kwargs: False


def _train(layers: int, variant: str, steps: int, batch: int) -> dict:
    import torch

    import thunderfx_debug  # noqa: F401 - its version workarounds must be in place before thunder is imported
    import thunder
    from thunder.dynamo import ThunderCompiler

    from thunderfx_debug.models import GPT, GPT_12_LAYER, synthetic_batches

    if variant == "no-nvfuser-embedding":
        _without_nvfuser_embedding()
    defaults = thunder.get_default_executors()
    kept = VARIANTS[variant]([e.name for e in defaults])
    executors = [e for e in defaults if e.name in kept]
    print(f"[{variant}] executors: {[e.name for e in executors]}", flush=True)
    torch.manual_seed(0)
    config = dataclasses.replace(GPT_12_LAYER, n_layer=layers)
    model = GPT(config).to(device="cuda", dtype=torch.bfloat16)
    batches = synthetic_batches(config, batch_size=batch, device="cuda")
    compiled = torch.compile(model, backend=ThunderCompiler(executors=executors))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for step in range(steps):
        started = time.perf_counter()
        loss = compiled(*next(batches))
        loss.backward()
        torch.cuda.synchronize()
        after_backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        losses.append(loss.item())
        print(f"[{variant}] step {step}: loss {losses[-1]:.6f}, fwd+bwd {after_backward - started:.2f} s, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    return {"variant": variant, "layers": layers, "ok": True, "losses": losses}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--variants", default="default,no-nvfuser,no-sdpa")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--json", default=None)
    parser.add_argument("--log-dir", default=None, help="write each variant's whole output here (<variant>.log)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        try:
            result = _train(args.layers, args.child, args.steps, args.batch)
        except BaseException as error:  # noqa: BLE001 - the probe reports whatever killed the step
            traceback.print_exc()
            result = {"variant": args.child, "layers": args.layers, "ok": False, "error": f"{type(error).__name__}: {error}"[:500]}
        print("PROBE_RESULT " + json.dumps(result), flush=True)
        return 0 if result["ok"] else 1
    results = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        started = time.perf_counter()
        try:
            completed = subprocess.run([sys.executable, __file__, "--child", variant, "--layers", str(args.layers),
                                        "--steps", str(args.steps), "--batch", str(args.batch)],
                                       capture_output=True, text=True, timeout=args.timeout, env=dict(os.environ))
            output = completed.stdout + completed.stderr
        except subprocess.TimeoutExpired as expired:
            output = f"{expired.stdout or ''}{expired.stderr or ''}\nTIMEOUT after {args.timeout} s"
        print(output[-6000:], flush=True)
        if args.log_dir:
            with open(os.path.join(args.log_dir, f"{variant}_{args.layers}.log"), "w") as file:
                file.write(output)
        lines = [line for line in output.splitlines() if line.startswith("PROBE_RESULT ")]
        result = json.loads(lines[-1][len("PROBE_RESULT "):]) if lines else {"variant": variant, "ok": False, "error": "no result (timeout or crash)"}
        result["wall_s"] = round(time.perf_counter() - started, 1)
        results.append(result)
        print(f"=== {variant}, {args.layers} layers: {'OK' if result['ok'] else 'FAILED ' + result.get('error', '')} "
              f"in {result['wall_s']} s", flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
