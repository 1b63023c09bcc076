"""`thunderfx-debug demo`: a short training run under ReportingBackend that writes a dump and prints its summary.

The model is a small GPT-style network with a Dynamo graph break and an op ThunderFX sends to inductor
(`thunderfx_debug.commands.models`), so the report has splits, split reasons and fusions to show. On CUDA Thunder fuses
with nvFuser; on CPU the demo adds Thunder's torch.compile executor, since Thunder's default executors fuse
nothing on CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from thunderfx_debug.render.progress import progress
from thunderfx_debug.render.text import plural
from thunderfx_debug.settings.config import environ_names

log = logging.getLogger("thunderfx_debug")

DEFAULT_DIR = "thunderfx_debug_demo"

#: The demo's own choices of settings: what it shows off (every repro script, split timing on a short run). They are
#: defaults: a THUNDERFX_DEBUG_* variable that is set replaces them, without a warning (nobody asked for these).
DEMO_SETTINGS = {"repro": "all", "timing": "split", "timing_every": 5, "timing_warmup": 2}


def default_executors(device: str) -> list:
    import thunder

    executors = list(thunder.get_default_executors())
    if device == "cpu":
        from thunder.executors.torch_compile import torch_compile_ex

        executors = [torch_compile_ex, *executors]
    return executors


def demo_dump_dir(dump_dir: str | os.PathLike | None, environ=os.environ) -> Path:
    """Where the demo writes: `dump_dir` where given (it wins over THUNDERFX_DEBUG_DIR, with a warning naming both
    when they differ: the user asked for this directory just now), else THUNDERFX_DEBUG_DIR, else ./thunderfx_debug_demo.

    Example:
        >>> str(demo_dump_dir(None, environ={"THUNDERFX_DEBUG_DIR": "/tmp/runs"}))
        '/tmp/runs'
    """
    variable = environ_names()["dump_dir"]
    from_environ = environ.get(variable, "").strip()
    if dump_dir is None:
        return Path(from_environ or DEFAULT_DIR).expanduser().absolute()
    chosen = Path(dump_dir).expanduser().absolute()
    if from_environ and Path(from_environ).expanduser().absolute() != chosen:
        log.warning("thunderfx_debug: --dir %s overrides %s=%s: the demo writes to %s (a directory given on the "
                    "command line wins over the environment)", dump_dir, variable, from_environ, chosen)
    return chosen


@contextlib.contextmanager
def _without_environ(variable: str) -> Iterator[None]:
    """`variable` unset while the backend reads its settings, so that the directory chosen above is the one used."""
    saved = os.environ.pop(variable, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[variable] = saved


def run_demo(steps: int = 30, dump_dir: str | os.PathLike | None = None, device: str | None = None,
             show_progress: bool = True) -> Path | None:
    """Trains the demo model for `steps` steps, flushes the dump and prints the summary; returns the rank
    directory written.

    The dump goes to `dump_dir` where given (it wins over THUNDERFX_DEBUG_DIR, with a warning), else to
    THUNDERFX_DEBUG_DIR, else to ./thunderfx_debug_demo. Other THUNDERFX_DEBUG_* variables replace the demo's own
    choices (`DEMO_SETTINGS`). `show_progress`: a bar on a terminal, log lines otherwise (`progress`).
    None is returned where this process's rank does not record (THUNDERFX_DEBUG_RANKS).
    """
    import torch

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import GPT, GPTConfig, synthetic_batches

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    directory = demo_dump_dir(dump_dir)
    names = environ_names()
    settings = {name: value for name, value in DEMO_SETTINGS.items() if names[name] not in os.environ}
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64, graph_break=True, sinc_gate=True)
    model = GPT(config).to(device)
    with _without_environ(names["dump_dir"]):
        backend = ReportingBackend(dump_dir=directory, executors=default_executors(device), **settings)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = synthetic_batches(config, batch_size=8, device=device)
    started = time.perf_counter()
    # The first steps compile (tens of seconds on a CPU): show progress from the start.
    with progress(steps, "training", unit="step", enabled=show_progress, delay_s=0) as step:
        for _ in range(steps):
            tokens, targets = next(batches)
            loss = compiled(tokens, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if show_progress:
                step(f"loss {loss.item():.3f}")  # the demo may synchronise; a real run need not
    elapsed = time.perf_counter() - started
    rank_dir = backend.flush()
    print(backend.report() if rank_dir is None else (rank_dir / "summary.txt").read_text())
    print(f"trained {plural(steps, 'step')} on {device} in {elapsed:.1f} s; dump written to {rank_dir}")
    if device == "cpu":
        print(CPU_FUSIONS_NOTE)
    return rank_dir


#: What the demo's CPU run does that a plain ReportingBackend() does not (said after its summary).
CPU_FUSIONS_NOTE = (
    "fusions on CPU: Thunder's default executors fuse nothing on CPU, so a plain ReportingBackend() there reports 0 "
    "fusion regions; this demo adds Thunder's torch.compile executor, as your training script can:\n"
    "  from thunder.executors.torch_compile import torch_compile_ex\n"
    "  backend = ReportingBackend(executors=[torch_compile_ex, *thunder.get_default_executors()])")
