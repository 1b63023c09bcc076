"""Helper process of tests/test_long_runs.py: trains a tiny function under ReportingBackend until it is killed.

    python tests/long_run.py DUMP_DIR MODE

MODE:
  periodic      THUNDERFX_DEBUG_FLUSH_EVERY=0.2: periodic flushes only (the test SIGKILLs it at some moment).
  own-handler   no periodic flushes; a SIGTERM handler of the script's own, installed before the backend, records
                what the dump looked like when it ran (DUMP_DIR/../handler.json) and exits with status 3.
  default       no periodic flushes and no handler of its own: SIGTERM's default action ends it.

Prints "step N" every 100 steps (N counted from 1), once the first step has run.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from pathlib import Path

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)


def main(dump_dir: str, mode: str) -> None:
    from thunderfx_debug import ReportingBackend

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks of a child that hangs

    if mode == "own-handler":

        def own_handler(signum, frame):
            manifest = Path(dump_dir) / "rank0" / "manifest.json"
            seen = json.loads(manifest.read_text()) if manifest.exists() else None
            Path(dump_dir).with_name("handler.json").write_text(json.dumps({
                "signum": signum, "flushes": seen and seen["flushes"], "calls_at_flush": seen and steps[0],
            }))
            sys.exit(3)

        signal.signal(signal.SIGTERM, own_handler)
    backend = ReportingBackend(dump_dir=dump_dir, timing="split", timing_every=1, timing_warmup=0, strict=True,
                               flush_every=0.2 if mode == "periodic" else 0)

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    compiled = torch.compile(f, backend=backend)
    w = torch.randn(8, 8, requires_grad=True)
    steps = [0]
    while True:
        compiled(torch.randn(4, 8), w).backward()
        steps[0] += 1
        if steps[0] % 100 == 1:
            print(f"step {steps[0]}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
