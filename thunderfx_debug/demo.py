"""`thunderfx-debug demo`: a short training run under ReportingBackend that writes a dump and prints its summary.

The model is a small GPT-style network with a Dynamo graph break and an op ThunderFX sends to inductor
(`thunderfx_debug.models`), so the report has splits, split reasons and fusions to show. On CUDA Thunder fuses
with nvFuser; on CPU the demo adds Thunder's torch.compile executor, since Thunder's default executors fuse
nothing on CPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def default_executors(device: str) -> list:
    import thunder

    executors = list(thunder.get_default_executors())
    if device == "cpu":
        from thunder.executors.torch_compile import torch_compile_ex

        executors = [torch_compile_ex, *executors]
    return executors


def run_demo(steps: int = 30, dump_dir: str | os.PathLike = "thunderfx_debug_demo", device: str | None = None,
             progress: bool = True) -> Path:
    """Trains the demo model for `steps` steps, flushes the dump into `dump_dir` and prints the summary.

    Returns the rank directory written. Settings from THUNDERFX_DEBUG_* environment variables apply (and win).
    """
    import torch

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.models import GPT, GPTConfig, synthetic_batches

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64, graph_break=True, sinc_gate=True)
    model = GPT(config).to(device)
    os.environ.setdefault("THUNDERFX_DEBUG_REPRO", "all")
    backend = ReportingBackend(
        dump_dir=dump_dir, timing="split", timing_every=5, timing_warmup=2, executors=default_executors(device)
    )
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = synthetic_batches(config, batch_size=8, device=device)
    bar = _progress(steps, progress)
    started = time.perf_counter()
    for step in range(steps):
        tokens, targets = next(batches)
        loss = compiled(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)  # the demo may sync; a real run need not
            bar.update(1)
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - started
    rank_dir = backend.flush()
    print(backend.report() if rank_dir is None else (rank_dir / "summary.txt").read_text())
    print(f"trained {steps} steps on {device} in {elapsed:.1f} s; dump written to {rank_dir}", file=sys.stderr)
    return rank_dir


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is an optional extra; the demo runs without a bar
        return None
    return tqdm(total=total, desc="training", unit="step", file=sys.stderr)
