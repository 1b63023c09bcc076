"""Thunder executors of our own whose kernels raise, the stand-ins of a user's executor that fails in the run.
Importing this module registers them (a repro script that imports it has them too, as it would a user's module). It
imports Thunder as a user's module does: whoever imports it has imported Thunder first (the tests import
thunderfx_debug first, a repro script imports Thunder with the workarounds it carries).

- `size7_ex` runs torch.tanh, and raises ValueError on an input with a dimension of size 7: a failure that the
  inputs' shapes decide, reproduced wherever the piece gets them.
- `third_call_ex` runs torch.tanh, and raises RuntimeError from its third call in a process on: a failure that
  depends on state only the training process had (how often it ran), which no script can reproduce.
- `backward_ex` runs torch.tanh with a gradient of its own, whose kernel raises RuntimeError: a failure in the
  backward only.
"""

from __future__ import annotations

import collections

import torch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor, get_executor, register_executor

_calls: collections.Counter[str] = collections.Counter()


def _size7_tanh(a):
    if 7 in a.shape:
        raise ValueError(f"size7_tanh refuses a dimension of size 7 (shape {tuple(a.shape)})")
    return torch.tanh(a)


def _third_call_tanh(a):
    _calls["third_call"] += 1
    if _calls["third_call"] >= 3:
        raise RuntimeError("third_call_tanh raises from its third call on")
    return torch.tanh(a)


def _tanh_backward(y, grad):
    raise RuntimeError(f"tanh_backward of backward_ex cannot differentiate (gradient of shape {tuple(grad.shape)})")


def _registered(name: str) -> OperatorExecutor:
    executor = OperatorExecutor(name, version="0")
    register_executor(executor)
    return executor


def _tanh_executor(name: str, fn) -> OperatorExecutor:
    existing = get_executor(name)
    if existing is not None:
        return existing
    executor = _registered(name)
    # A meta of its own (not `like=`) leaves the symbol without subsymbols: no fusion executor takes it into a region.
    op = executor.register_operator(f"{name}_tanh", meta=lambda a: TensorProxy(like=a), fn=fn)
    executor.register_implementation(prims.tanh, op)
    return executor


def _backward_executor(name: str) -> OperatorExecutor:
    existing = get_executor(name)
    if existing is not None:
        return existing
    executor = _registered(name)
    forward = executor.register_operator(f"{name}_tanh", meta=lambda a: TensorProxy(like=a), fn=torch.tanh)
    backward = executor.register_operator(f"{name}_tanh_backward", meta=lambda y, grad: TensorProxy(like=grad),
                                          fn=_tanh_backward)

    def grad_transform(a):
        y = forward(a)
        put_grad(a, backward(y, get_grad(y)))
        return y

    executor.register_implementation(prims.tanh, forward, grad_transform=grad_transform)
    return executor


size7_ex = _tanh_executor("thunderfx_debug_test_size7", _size7_tanh)
third_call_ex = _tanh_executor("thunderfx_debug_test_third_call", _third_call_tanh)
backward_ex = _backward_executor("thunderfx_debug_test_backward")
