"""Thunder executors of our own that compute one op wrongly, for the correctness sentinel's tests: each claims a
Thunder op (at the torch level and as a prim), listed first in `executors` it runs that op instead of any other.
Importing this module registers nothing; `wrong_sin_executor()` and `wrong_cos_executor()` register on first use
(a subprocess that imports this module and calls them can rerun a mismatch script with the run's executors)."""

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
