"""Helper process of tests/test_triage_isolation.py: trains a tiny model under ReportingBackend with the triage on and
its children as fresh interpreters (as where CUDA is initialised), waits until a child compiles a split ahead of the
flush, prints that child's process id and folder, and dies without a flush (`os._exit`).

    python tests/ahead_then_die.py DUMP_DIR
"""

from __future__ import annotations

import os
import sys
import time

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)
from thunderfx_debug import ReportingBackend
from thunderfx_debug.triage import at_flush


def main(dump_dir: str) -> None:
    at_flush.forks = lambda settings: False  # the children of a process that initialised CUDA
    backend = ReportingBackend(dump_dir=dump_dir, triage="split", flush_every=0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    for _ in range(3):
        compiled(x).sum().backward()
    ahead = backend._flusher._triager.ahead
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ahead.children:
        time.sleep(0.2)
    for child in ahead.children.values():
        print(child.process.pid, child.folder, flush=True)
    os._exit(0)  # neither a flush nor an exit hook


if __name__ == "__main__":
    main(sys.argv[1])
