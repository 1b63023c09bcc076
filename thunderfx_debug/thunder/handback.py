"""A piece handed back to Thunder: the one fusion region Thunder made of a function it jitted, and how the region's
inputs and outputs line up with the function's, so that a script can run the region alone (nvFuser's own
definition of it, `scripts.nvfuser_repro_source`) on the function's inputs and compare it with the function.

Checked against lightning-thunder 0.2.6: the last trace of a jitted function is its computation trace, whose `args`
are the function's inputs in order (flattened) and whose return statement lists its outputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.utils._pytree import tree_leaves

#: Bound symbols of a computation trace that are bookkeeping, not computation.
_BOOKKEEPING = frozenset({"unpack_trivial", "unpack_sequence", "python_return", "python_del", "return",
                          "check_tensor_shape_and_metadata", "unpack_tuple", "del"})


@dataclasses.dataclass(frozen=True)
class HandedBack:
    """The region `bsym` and, for each of its inputs and outputs in order, the position of that value among the
    function's inputs and outputs."""

    bsym: Any
    input_positions: tuple[int, ...]
    output_positions: tuple[int, ...]


def _name(value: Any) -> str | None:
    return getattr(value, "name", None)


def single_fusion(jitted) -> HandedBack:
    """The one fusion region of the last trace Thunder ran for `jitted`, which must compute everything the function
    returns from the function's own inputs; LookupError saying why where it does not."""
    import thunder

    trace = thunder.last_traces(jitted)[-1]
    fusions = [b for b in trace.bound_symbols if b.sym.is_fusion]
    if len(fusions) != 1:
        raise LookupError(f"Thunder made {len(fusions)} fusion regions of the piece, not one")
    (fusion,) = fusions
    outside = [b.sym.name for b in trace.bound_symbols if not b.sym.is_fusion and b.sym.name not in _BOOKKEEPING]
    if outside:
        raise LookupError(f"Thunder ran ops outside the fusion region: {', '.join(sorted(set(outside)))}")
    arguments = [_name(a) for a in tree_leaves(list(trace.args))]
    returned = next((b for b in reversed(trace.bound_symbols) if b.sym.name in ("python_return", "return")), None)
    if returned is None:
        raise LookupError("the trace has no return statement")
    outputs = [_name(o) for o in tree_leaves(list(returned.args))]
    inputs_at, outputs_at = [], []
    for value in fusion.flat_args:
        if _name(value) not in arguments:
            raise LookupError(f"the region's input {_name(value) or value!r} is not an input of the piece")
        inputs_at.append(arguments.index(_name(value)))
    fused = [_name(o) for o in fusion.flat_outs]
    if sorted(fused) != sorted(outputs):
        raise LookupError(f"the region returns {fused}, the piece {outputs}")
    outputs_at = [outputs.index(name) for name in fused]
    return HandedBack(fusion, tuple(inputs_at), tuple(outputs_at))
