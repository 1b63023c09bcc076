"""Thunder executors of our own for F.dropout, the stand-ins of a user's executor: one right, two planted wrong.
Importing this module registers them (a repro script that imports it has them too, as it would a user's module). It
imports Thunder as a user's module does: whoever imports it has imported Thunder first.

- `right_dropout_ex`: F.dropout as torch computes it.
- `wrong_scale_dropout_ex`: F.dropout's mask with the kept values scaled by 1.01 / (1 - p).
- `wrong_fraction_dropout_ex`: drops 1.5 p of the values (and scales the rest as for p).

`DroppedHidden` is the model they are planted in: one dropout, on a hidden activation that needs a gradient.

Each has a gradient rule (without one Thunder's autograd decomposes dropout and the executor never runs): the
incoming gradient where the op kept a value, scaled by 1 / (1 - p). Each op is a prim of its executor (a meta, not
`like=ltorch.dropout`): an op registered like dropout carries dropout's decomposition, which nvFuser claims and fuses
in its place (seen on CUDA with Thunder 0.2.6), so that the executor's own code never ran.
"""

from __future__ import annotations

import thunder.torch as ltorch
import torch
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor, get_executor, register_executor


def _dropout_executor(name: str, dropout) -> OperatorExecutor:
    existing = get_executor(name)
    if existing is not None:
        return existing
    executor = OperatorExecutor(name, version="0")
    register_executor(executor)
    op = executor.register_operator(name, meta=_dropout_meta, fn=dropout)

    def with_gradient(a, p=0.5, training=True, inplace=False):
        out = op(a, p, training, inplace)
        put_grad(a, ltorch.mul(ltorch.mul(get_grad(out), ltorch.ne(out, 0)), 1 / (1 - p)))
        return out

    executor.register_implementation(ltorch.dropout, op, checker=lambda *args, **kwargs: True,
                                     grad_transform=with_gradient)
    return executor


def _dropout_meta(a, p=0.5, training=True, inplace=False):
    return TensorProxy(like=a)


def _right(a, p=0.5, training=True, inplace=False):
    return torch.nn.functional.dropout(a, p, training)


def _wrong_scale(a, p=0.5, training=True, inplace=False):
    return torch.nn.functional.dropout(a, p, training) * 1.01


def _wrong_fraction(a, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return a
    dropped = min(1.5 * p, 1.0)
    return torch.nn.functional.dropout(a, dropped, training) * ((1 - dropped) / (1 - p))


right_dropout_ex = _dropout_executor("thunderfx_debug_test_right_dropout", _right)
wrong_scale_dropout_ex = _dropout_executor("thunderfx_debug_test_wrong_scale_dropout", _wrong_scale)
wrong_fraction_dropout_ex = _dropout_executor("thunderfx_debug_test_wrong_fraction_dropout", _wrong_fraction)


class DroppedHidden(torch.nn.Module):
    """One dropout, on a hidden activation that needs a gradient: an executor's own dropout op runs through its
    gradient rule."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = p
        self.w1, self.w2 = (torch.nn.Parameter(torch.randn(32, 32) / 6) for _ in range(2))

    def forward(self, x):
        return torch.tanh(torch.nn.functional.dropout(x @ self.w1, self.p, training=True) @ self.w2).square().mean()
