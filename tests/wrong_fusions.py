"""Executors of our own that fail inside a fusion region or a split, for the minimizer's tests. Importing this module
registers nothing; each function registers its executor on first use (a process that imports this module and calls
them, e.g. from a `sitecustomize`, can run a script that names them)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from wrong_executors import _wrong_executor, wrong_sin_executor

WRONG_FUSION = "thunderfx_debug_test_wrong_fusion"


def _wrong_torch_op(op: str):
    """An operator executor computing the unary elementwise `op` ("sin", "tanh") wrongly (+ 0.25)."""
    if op == "sin":
        return wrong_sin_executor()
    return _wrong_executor(f"thunderfx_debug_test_wrong_{op}", op, lambda a: getattr(torch, op)(a) + 0.25)


def wrong_fusion_executor(op: str = "sin"):
    """A fusion executor that claims every op Thunder's torch executor runs and runs its regions (WrongFusionN) as
    their torch ops, eagerly, with the unary `op` (sin, tanh) computed wrongly (+ 0.25): a region of many ops with
    one wrong. Named WRONG_FUSION for sin, `WRONG_FUSION_<op>` otherwise."""
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.proxies import unvariableify
    from thunder.core.symbol import BoundSymbol, Symbol
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torch_compile import TorchCompileExecutor
    from thunder.executors.torchex import ex as torch_ex
    from thunder.extend import ImplInfo, get_executor, register_executor

    name = WRONG_FUSION if op == "sin" else f"{WRONG_FUSION}_{op}"
    existing = get_executor(name)
    if existing is not None:
        return existing
    wrong_op = _wrong_torch_op(op)

    class WrongFusion(TorchCompileExecutor):
        def fuse(self, region, fusion_counter):
            inputs = [unvariableify(x) for x in region.inputs]
            outputs = [unvariableify(x) for x in region.outputs]
            trace = TraceCtx(None)
            trace.args, trace.kwargs, trace.names = inputs, {}, {a.name for a in inputs}
            with tracectx(trace):
                for a in inputs:
                    prims.unpack_trivial(a, name=a.name)
            trace.bound_symbols += list(region.bound_symbols)
            trace.bound_symbols.append(prims.python_return.bind(outputs, output=None))
            for bsym in trace.bound_symbols:
                if bsym.sym == prims.unpack_trivial:
                    continue
                for sub in (bsym, *bsym.subsymbols):
                    for o in sub.flat_outs:
                        if o is not None and o.name not in trace.names:
                            trace.add_name(o.name)
            trace._siginfo = SigInfo("wrong_region")
            trace._siginfo.args = [(a.name, None) for a in inputs]
            lowered = transform_for_execution(trace, executors_list=(wrong_op, torch_ex))
            name = f"WrongFusion{fusion_counter}"
            compiled = torch.no_grad()(lowered.python_callable(include_decorators=False))
            symbol = Symbol(name, meta=None, is_fusion=True, executor=self)
            return BoundSymbol(symbol, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: compiled})

    executor = WrongFusion(name)
    executor._implmap = {op: ImplInfo() for op in torch_ex.implmap}
    register_executor(executor)
    return executor


def crashing_sin_executor():
    """sin raises: a split that crashes under Thunder on inputs eager computes."""

    def refuse(a):
        raise RuntimeError("the test executor refuses sin")

    return _wrong_executor("thunderfx_debug_test_crashing_sin", "sin", refuse)


def flaky_sin_executor():
    """sin(x) + 0.25 on every other call, counted in the file $THUNDERFX_DEBUG_TEST_FLAKY (across processes): a
    failure that changes between identical runs."""

    def sometimes_wrong(a):
        counter = Path(os.environ["THUNDERFX_DEBUG_TEST_FLAKY"])
        calls = int(counter.read_text() or 0) if counter.exists() else 0
        counter.write_text(str(calls + 1))
        return torch.sin(a) + (0.25 if calls % 2 == 0 else 0.0)

    return _wrong_executor("thunderfx_debug_test_flaky_sin", "sin", sometimes_wrong)


def aborting_sin_executor():
    """sin aborts the process (SIGABRT), as a failed device assert or a native check does."""

    def abort(a):
        os.abort()

    return _wrong_executor("thunderfx_debug_test_aborting_sin", "sin", abort)
