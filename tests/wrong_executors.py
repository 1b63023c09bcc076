"""Thunder executors of our own that compute one op wrongly, for the correctness sentinel's tests: each claims a
Thunder op (at the torch level and as a prim), listed first in `executors` it runs that op instead of any other.
Importing this module registers nothing; `wrong_sin_executor()` and `wrong_cos_executor()` register on first use
(a subprocess that imports this module and calls them can rerun a mismatch script with the run's executors).
`tie_breaking_topk_executor()` computes topk rightly but picks the last of tied values, as a backend of its own
may (nvFuser does on the H200), and `sin_apart_executor()` computes sin rightly outside every fusion region."""

from __future__ import annotations

import torch


def _wrong_executor(name: str, op_name: str, wrong):
    import thunder.torch as ltorch
    from thunder.core import prims
    from thunder.extend import OperatorExecutor, get_executor, register_executor

    existing = get_executor(name)
    if existing is not None:
        return existing
    executor = OperatorExecutor(name, version="0")
    register_executor(executor)
    op = executor.register_operator(name, like=getattr(ltorch, op_name), fn=wrong)
    for symbol in (getattr(ltorch, op_name), getattr(prims, op_name)):
        executor.register_implementation(symbol, op, checker=lambda *args, **kwargs: True)
    return executor


def wrong_sin_executor():
    """sin(x) + 0.25."""
    return _wrong_executor("thunderfx_debug_test_wrong_sin", "sin", lambda a: torch.sin(a) + 0.25)


def wrong_cos_executor():
    """cos(x) * 1.5: Thunder differentiates sin with cos, so sin's gradient comes out wrong."""
    return _wrong_executor("thunderfx_debug_test_wrong_cos", "cos", lambda a: torch.cos(a) * 1.5)


def slightly_wrong_sin_executor():
    """sin(x) * 1.3: 30% off, which is well beyond bf16's rounding but within an absolute tolerance of 0.05 for
    values ~1e-3."""
    return _wrong_executor("thunderfx_debug_test_slightly_wrong_sin", "sin", lambda a: torch.sin(a) * 1.3)


def _topk_last_of_ties(a, k, dim=None, largest=True, sorted=True):
    dim = -1 if dim is None else dim
    values, indices = torch.topk(a.flip(dim), k, dim, bool(largest), bool(sorted))
    return values, a.size(dim) - 1 - indices


def tie_breaking_topk_executor():
    """topk picking the last of tied values (torch's CPU kernel picks others): right, but not eager's picks."""
    return _wrong_executor("thunderfx_debug_test_tie_breaking_topk", "topk", _topk_last_of_ties)


def wrong_topk_executor():
    """topk of the smallest values where the largest are asked for."""
    return _wrong_executor("thunderfx_debug_test_wrong_topk", "topk",
                           lambda a, k, dim=None, largest=True, sorted=True: torch.topk(
                               a, k, -1 if dim is None else dim, not largest, bool(sorted)))


def sin_apart_executor():
    """sin, rightly, by an executor of its own: listed first, it cuts the fusion regions around every sin."""
    return _wrong_executor("thunderfx_debug_test_sin_apart", "sin", torch.sin)
