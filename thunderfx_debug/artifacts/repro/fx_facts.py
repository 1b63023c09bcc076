"""What a repro script needs to know about an FX graph (a Dynamo graph or a split) beyond its code: which of its ops
draw random numbers, which integer inputs index a dimension, and of what size, and which modules define the custom
ops it calls.

Example:
    >>> import torch
    >>> def f(ids, weight, x):
    ...     return torch.nn.functional.embedding(ids, weight), torch.nn.functional.dropout(x, 0.1, True)
    >>> gm = torch.fx.symbolic_trace(f)
    >>> random_ops(gm), index_bounds(gm, {1: (128, 32)})
    (('dropout',), {0: 128})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from thunderfx_debug.recording.piece_facts import op_base_name, split_facts
from thunderfx_debug.thunder import torch_private
from thunderfx_debug.thunder.draws import split_draws


def custom_op_imports(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The imports a script of `gm` needs for the custom ops it calls (`torch.ops.transformers.grouped_mm_fallback`
    exists once `transformers.integrations.moe` is imported), one line each, saying which op it brings."""
    lines = {}
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                found = torch_private.custom_op_module(node.target) if node.op == "call_function" else None
                if found is not None:
                    lines.setdefault(f"import {found[1]}", f"  # defines torch.ops.{found[0].replace('::', '.')}")
    return tuple(f"{line}{comment}" for line, comment in lines.items())


def random_ops(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The names of the ops of `gm` (and of its nested graph modules) that draw random numbers, in graph order: the
    correctness sentinel's reading of them (`recording.piece_facts`)."""
    return split_facts(gm).random_ops


def thunder_draws(gm: torch.fx.GraphModule, forward_trace) -> str | None:
    """How the Thunder split of `gm` drew its dropouts, where a reference can draw them so (`thunder.draws`), else
    None."""
    facts = split_facts(gm)
    return split_draws(forward_trace, facts.dropouts)[0] if facts.draws_in_dropouts_only else None


def _shape(node, placeholder_shapes: Mapping[int, Sequence[int]], positions: Mapping[str, int]):
    """The shape of an FX value: a placeholder's recorded shape, else the example value Dynamo attached."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.name in positions and positions[node.name] in placeholder_shapes:
        return tuple(placeholder_shapes[positions[node.name]])
    example = node.meta.get("example_value", node.meta.get("val"))
    shape = getattr(example, "shape", None)
    try:
        return None if shape is None else tuple(int(s) for s in shape)
    except (TypeError, ValueError):  # symbolic sizes
        return None


def index_bounds(gm: torch.fx.GraphModule, placeholder_shapes: Mapping[int, Sequence[int]]) -> dict[int, int]:
    """Placeholder position -> the size of the dimension that placeholder indexes, for integer inputs consumed by
    embedding, index_select, gather, take_along_dim, indexing (`x[idx]`, `x[:, idx]`) or a loss's target (the
    number of classes). `placeholder_shapes` gives the shapes of the placeholders by position (others come from
    the nodes' example values)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    positions = {node.name: i for i, node in enumerate(placeholders)}
    bounds: dict[int, int] = {}

    def note(index_node, source, dim):
        if not isinstance(index_node, torch.fx.Node) or index_node.name not in positions:
            return
        shape = _shape(source, placeholder_shapes, positions)
        if shape is not None and -len(shape) <= dim < len(shape):
            bounds.setdefault(positions[index_node.name], shape[dim])

    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = op_base_name(node)
        args = node.args
        if name == "embedding" and len(args) >= 2:
            note(args[0], args[1], 0)
        elif name in ("index_select", "gather", "take_along_dim") and len(args) >= 3:
            source, first, second = args[0], args[1], args[2]
            index, dim = (second, first) if name == "index_select" or name == "gather" else (first, second)
            if name == "take_along_dim":
                index, dim = args[1], args[2]
            if isinstance(dim, int):
                note(index, source, dim)
        elif name in ("cross_entropy", "nll_loss") and len(args) >= 2:
            shape = _shape(args[0], placeholder_shapes, positions)
            if shape:
                note(args[1], args[0], 1 if len(shape) > 1 else 0)
        elif name == "getitem" and len(args) == 2 and isinstance(args[0], torch.fx.Node):
            keys = args[1] if isinstance(args[1], tuple) else (args[1],)
            if Ellipsis in keys:
                continue
            dim = 0
            for key in keys:
                note(key, args[0], dim)
                dim += 0 if key is None else 1
    return bounds
