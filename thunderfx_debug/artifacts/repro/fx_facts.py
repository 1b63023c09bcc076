"""What a repro script needs to know about an FX graph (a Dynamo graph or a split) beyond its code: which of its ops
draw random numbers, and which integer inputs index a dimension, and of what size.

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

_RANDOM = frozenset({
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "normal", "normal_", "uniform_", "random_", "multinomial", "exponential_", "geometric_", "cauchy_", "log_normal_",
    "poisson", "rrelu", "native_dropout",
})
_DROPOUT = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})


def _name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    return getattr(target, "__name__", None) or str(target).rsplit(".", 1)[-1]


def _argument(node: torch.fx.Node, position: int, keyword: str, default=None):
    if keyword in node.kwargs:
        return node.kwargs[keyword]
    return node.args[position] if len(node.args) > position else default


def _draws(node: torch.fx.Node) -> bool:
    name = _name(node)
    if name in _RANDOM:
        return True
    if name in _DROPOUT:  # F.dropout(input, p=0.5, training=True): random only when training with p > 0
        p, training = _argument(node, 1, "p", 0.5), _argument(node, 2, "training", True)
        return not isinstance(p, (int, float)) or (p > 0 and training is not False)
    if name == "scaled_dot_product_attention":
        p = _argument(node, 4, "dropout_p", 0.0)
        return not isinstance(p, (int, float)) or p > 0
    return False


def random_ops(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The names of the ops of `gm` (and of its nested graph modules) that draw random numbers, in graph order."""
    found: list[str] = []
    for module in gm.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op in ("call_function", "call_method") and _draws(node):
                found.append(_name(node))
    return tuple(dict.fromkeys(found))


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
        name = _name(node)
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
