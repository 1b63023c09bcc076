"""Helper process of tests/test_dump.py: trains a tiny function under ReportingBackend and flushes its dump over and
over, until the test SIGKILLs it in the middle of a flush.

    python tests/flush_and_die.py DUMP_DIR STALL_FILE

Prints "flushed N" after each complete flush. Once STALL_FILE exists, the next flush stops for good right before
`manifest.json` is renamed into place (every other file of the new dump already written and renamed), prints
"stalled", and waits to be killed. The stall is a test-only hook: this script wraps `os.replace`, nothing in
thunderfx_debug knows about it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)


def main(dump_dir: str, stall_file: str) -> None:
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    from thunderfx_debug import ReportingBackend

    backend = ReportingBackend(
        dump_dir=dump_dir, executors=[torch_compile_ex, *thunder.get_default_executors()],
        timing="split", timing_every=1, timing_warmup=0, strict=True,
    )

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    compiled = torch.compile(f, backend=backend)
    w = torch.randn(8, 8, requires_grad=True)
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == "manifest.json" and os.path.exists(stall_file):
            print("stalled", flush=True)
            time.sleep(3600)  # killed here: the new manifest is complete in its temporary file, not renamed
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace
    flushes = 0
    while True:
        compiled(torch.randn(4, 8), w).backward()
        backend.flush()
        flushes += 1
        print(f"flushed {flushes}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
