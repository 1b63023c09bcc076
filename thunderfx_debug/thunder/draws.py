"""How the run drew its random numbers, read from Thunder's traces, so that a reference draws them again: an
nvFusion region's dropout draws (`draws_as_nvfuser`, lowered by `nvfuser_draws_executor`) and a Thunder split's
(`split_draws`: one of `scripts.philox_draws.DRAWS`, or why not). Read at flush and on a checked call, never on the
training path. Checked against lightning-thunder 0.2.6 and nvFuser 0.2.36 (tests/test_philox_draws.py -m cuda,
tests/test_dropout_compared.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

#: Thunder's ops that draw random numbers or take the RNG state (by symbol name).
RANDOM_SYMBOLS = frozenset({
    "uniform", "uniform_philox", "randn", "rand", "randint", "bernoulli", "multinomial", "normal", "dropout",
    "get_and_update_rng_state", "randn_like", "rand_like", "randint_like", "philox_rand", "randperm", "exponential",
    "poisson", "native_dropout",
})


def _walk(bsyms: Iterable):
    for bsym in bsyms:
        yield bsym
        yield from _walk(bsym.subsymbols)


def _on_unit_interval(uniform_philox) -> bool:
    """Whether a `uniform_philox` bound symbol draws on [0, 1) (dropout's; its minval and maxval are args 1 and 2)."""
    return tuple(uniform_philox.args[1:3]) == (0.0, 1.0)


def draws_as_nvfuser(bsym) -> bool:
    """Whether the region's torch code draws its `uniform_philox` numbers as nvFuser does: an nvFusion region's do.

    Thunder lowers dropout's `uniform` to `uniform_philox(shape, seed=, offset=)` where nvFuser is an executor
    (`replace_uniform`, thunder/core/rematerialization.py, called from thunder/executors/nvfuserex_impl.py), with
    the CUDA generator's seed and offset read at run time and passed to the region as numbers. nvFuser lays the
    Philox draws out otherwise than torch's `rngprims.philox_rand` (Thunder's torch executor), so the same seed and
    offset give other numbers there: `scripts.philox_draws.nvfuser_uniform` draws nvFuser's, bit for bit (held to
    nvFuser's own by tests/test_philox_draws.py -m cuda). A TorchCompile region keeps torch's lowering."""
    return getattr(getattr(bsym.sym, "executor", None), "name", None) == "nvfuser"


#: Thunder's comparison prims, which nvFuser computes in float32 where a half or bfloat16 tensor meets a number.
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


@functools.cache
def nvfuser_draws_executor(opaque: bool = False):
    """An executor, for the lowering alone (not registered), that lowers an nvFusion region's ops as nvFuser computes
    them where torch's lowering would not:
    - `uniform_philox` on [0, 1): `nvfuser_uniform(shape, seed, offset, dtype, device)`, nvFuser's draws (with
      `opaque`, `nvfuser_uniform_opaque`: the same through a custom op, for a region function that torch.compile
      compiles);
    - a comparison of a half or bfloat16 tensor with a number: `compared_in_float32`, as nvFuser compares (torch
      casts the number to the tensor's dtype, so that a dropout's mask `u < 1 - p` would keep other elements)."""
    import thunder.torch as ltorch
    import torch
    from thunder.core import prims
    from thunder.core.devices import to_torch_device
    from thunder.core.dtypes import to_torch_dtype
    from thunder.core.proxies import TensorProxy
    from thunder.extend import OperatorExecutor

    from thunderfx_debug.scripts import philox_draws

    def like(shape, seed, offset, dtype, device):
        return ltorch.uniform_philox(shape, 0.0, 1.0, device=device, dtype=dtype, seed=seed, offset=offset)

    executor = OperatorExecutor("thunderfx_debug_nvfuser_draws" + ("_opaque" if opaque else ""))
    draw_fn = philox_draws.nvfuser_uniform_opaque if opaque else philox_draws.nvfuser_uniform
    draw = executor.register_operator(draw_fn.__name__, like=like, fn=draw_fn)

    def on_unit_interval(shape, minval=0.0, maxval=1.0, *, device, dtype, seed, offset) -> bool:
        return minval == 0.0 and maxval == 1.0

    def lowering(shape, minval=0.0, maxval=1.0, *, device, dtype, seed, offset):
        return draw(shape, seed, offset, to_torch_dtype(dtype), to_torch_device(device))

    for symbol in (prims.uniform_philox, ltorch.uniform_philox):
        executor.register_implementation(symbol, checker=on_unit_interval, execution_transform=lowering)

    def compare_like(a, b, comparison):
        return prims.lt(a, b)  # every comparison's result: a bool tensor of the broadcast shape

    compare = executor.register_operator("compared_in_float32", like=compare_like,
                                         fn=philox_draws.compared_in_float32)

    def half(x) -> bool:
        return isinstance(x, TensorProxy) and to_torch_dtype(x.dtype) in (torch.float16, torch.bfloat16)

    def half_against_number(a, b) -> bool:
        return (half(a) and not isinstance(b, TensorProxy)) or (half(b) and not isinstance(a, TensorProxy))

    def compare_lowering(comparison):
        return lambda a, b: compare(a, b, comparison)

    for comparison in COMPARISONS:
        executor.register_implementation(getattr(prims, comparison), checker=half_against_number,
                                         execution_transform=compare_lowering(comparison))
    return executor


def reproduced_random_ops(bsym) -> frozenset[str]:
    """The random ops of a region whose numbers its torch code draws as the run drew them (`draws_as_nvfuser`)."""
    return frozenset({"uniform_philox"}) if draws_as_nvfuser(bsym) and all(
        _on_unit_interval(sub) for sub in _walk(bsym.subsymbols) if sub.sym.name == "uniform_philox") else frozenset()


def split_draws(forward_trace, dropouts: int) -> tuple[str | None, str]:
    """How a Thunder split's forward drew its `dropouts` dropouts (the F.dropout calls of its FX graph that draw),
    from the final forward trace Thunder ran: ("nvfuser" | "torch_uniform" | "eager", "") where each was drawn that
    way, one draw per dropout, or (None, why not).

    Each top-level op of the trace runs as one call: in an nvFusion region, `uniform_philox` is nvFuser's draw; a
    top-level `uniform` is the torch executor's; a trace that draws nothing itself while the graph has dropouts ran
    them in an executor's own op ("eager": drawn as eager's F.dropout from the same generator state, the only way
    such an op is known to draw); anything else (a TorchCompile region's draws, which inductor makes its own way, or
    a mix) cannot be drawn again."""
    if forward_trace is None:
        return None, "the split's forward trace is not known"
    kinds = []
    for bsym in getattr(forward_trace, "bound_symbols", ()):
        executor = getattr(getattr(bsym.sym, "executor", None), "name", None)
        inside = list(_walk(bsym.subsymbols)) if bsym.sym.is_fusion else []
        for sub in ([bsym] if not bsym.sym.is_fusion else inside):
            name = sub.sym.name
            if name == "get_and_update_rng_state" or name not in RANDOM_SYMBOLS:
                continue
            if name == "uniform_philox" and bsym.sym.is_fusion and executor == "nvfuser" and _on_unit_interval(sub):
                kinds.append("nvfuser")
            elif name == "uniform" and not bsym.sym.is_fusion:
                kinds.append("torch_uniform")
            else:
                where = f"in a {executor} region" if bsym.sym.is_fusion else "at the trace's top level"
                return None, f"it draws with {name} {where}, which no reference here draws again"
    if not kinds:
        return ("eager", "") if dropouts else (None, "it draws nothing")
    if len(set(kinds)) > 1 or len(kinds) != dropouts:
        return None, (f"its trace draws {len(kinds)} times ({', '.join(sorted(set(kinds)))}) for {dropouts} "
                      "dropouts of its graph: the draws cannot be matched to them")
    return kinds[0], ""
