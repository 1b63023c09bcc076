"""Thunder executors of our own whose op is fine in the training process and not in any other: the stand-ins of a
piece that a device-side assert or a hang takes down where the flush re-runs it. Importing this module registers
them (a child process that imports it has them too, as a user's executor module would); the training process names
itself in `TRAINING_PID` first.

- `aborting_ex` runs torch.tanh; elsewhere, from its second call in a process on, it calls `os.abort()` (a native
  abort, as inductor's C++ kernels do on an index out of bounds): a child dies once the split compiled and ran once.
- `hanging_ex` runs torch.exp; elsewhere it sleeps for an hour at its first call.
- `asserting_ex` runs torch.tanh; elsewhere, from its second call in a process on, it also indexes a CUDA tensor out
  of its bounds: a real device-side assert, which leaves that process's CUDA context unusable.
"""

from __future__ import annotations

import collections
import os
import time

import torch

import thunderfx_debug  # noqa: F401  (before thunder: the workaround `import thunder` needs on this torch)
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.extend import OperatorExecutor, get_executor, register_executor

TRAINING_PID = "THUNDERFX_DEBUG_TEST_TRAINING_PID"
_calls: collections.Counter[int] = collections.Counter()


def _elsewhere() -> bool:
    return os.environ.get(TRAINING_PID, str(os.getpid())) != str(os.getpid())


def _aborting_tanh(a):
    _calls[os.getpid()] += 1
    if _elsewhere() and _calls[os.getpid()] >= 2:
        os.abort()
    return torch.tanh(a)


def _asserting_tanh(a):
    _calls[os.getpid()] += 1
    if _elsewhere() and _calls[os.getpid()] >= 2 and a.is_cuda:
        a.flatten()[torch.tensor([a.numel() + 10**6], device=a.device)].sum()  # queued; the assert fires on the device
    return torch.tanh(a)


def _hanging_exp(a):
    if _elsewhere():
        time.sleep(3600)
    return torch.exp(a)


def _executor(name: str, prim, fn):
    existing = get_executor(name)
    if existing is not None:
        return existing
    executor = OperatorExecutor(name, version="0")
    register_executor(executor)
    # A meta of its own (not `like=`) leaves the symbol without subsymbols: no fusion executor takes it into a region.
    op = executor.register_operator(f"{name}_op", meta=lambda a: TensorProxy(like=a), fn=fn)
    executor.register_implementation(prim, op)
    return executor


aborting_ex = _executor("thunderfx_debug_test_aborting", prims.tanh, _aborting_tanh)
hanging_ex = _executor("thunderfx_debug_test_hanging", prims.exp, _hanging_exp)
asserting_ex = _executor("thunderfx_debug_test_asserting", prims.tanh, _asserting_tanh)
