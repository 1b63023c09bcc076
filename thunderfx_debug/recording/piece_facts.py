"""What the correctness check needs to know about a split's FX graph before it compares anything: which ops draw
random numbers and which outputs and input gradients depend on them (those cannot be compared with eager: Thunder
draws its dropout as `uniform < p`, eager as `bernoulli`, so the streams never match), and which inputs the graph
writes into (the eager reference needs their values from before the split ran).

Example:
    >>> import torch
    >>> def f(x, w, y):
    ...     h = torch.nn.functional.dropout(x @ w, 0.1, True)
    ...     y.add_(1)
    ...     return h.sum(), (w * 2).sum()
    >>> facts = split_facts(torch.fx.symbolic_trace(f))
    >>> facts.random_ops, facts.random_outputs, facts.random_gradients, facts.mutated_inputs
    (('dropout',), (0,), (0, 1), (2,))
"""

from __future__ import annotations

import dataclasses
import operator

import torch
from torch.utils._pytree import tree_leaves

_RANDOM = frozenset({
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "normal", "normal_", "uniform_", "random_", "multinomial", "exponential_", "geometric_", "cauchy_", "log_normal_",
    "poisson", "rrelu", "rrelu_", "native_dropout", "gumbel_softmax",
})
_DROPOUT = frozenset({"dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                      "feature_alpha_dropout"})
# Ops whose result may share memory with their first argument: a write into the result writes into the argument.
_VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "expand", "expand_as", "narrow",
    "select", "unsqueeze", "squeeze", "flatten", "unflatten", "as_strided", "detach", "contiguous", "split",
    "chunk", "unbind", "getitem", "movedim", "swapaxes", "swapdims", "diagonal", "real", "imag", "view_as_real",
    "view_as_complex", "unfold", "T", "mT", "H", "mH", "alias", "to", "type_as",
})
_IN_PLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                       operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
                       operator.ilshift, operator.irshift, operator.imatmul}


def op_base_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    name = getattr(target, "__name__", None) or str(target)
    return name.rsplit(".", 1)[-1]


def _argument(node: torch.fx.Node, position: int, keyword: str, default=None):
    if keyword in node.kwargs:
        return node.kwargs[keyword]
    return node.args[position] if len(node.args) > position else default


def _submodules(node: torch.fx.Node, gm: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """Graph modules a node runs: a call_module's target, or get_attr arguments of a higher-order op."""
    found = []
    candidates = [node.target] if node.op == "call_module" else [
        a.target for a in tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    for target in candidates:
        module = gm
        for part in str(target).split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.fx.GraphModule):
            found.append(module)
    return found


def draws_random_numbers(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str | None:
    """The name of the random op `node` is (or runs, in a nested graph), None if it draws no random number."""
    if node.op == "call_module" or (node.op == "call_function" and _submodules(node, gm)):
        for module in _submodules(node, gm):
            for inner in module.graph.nodes:
                name = draws_random_numbers(inner, module)
                if name:
                    return name
        return None
    if node.op not in ("call_function", "call_method"):
        return None
    name = op_base_name(node)
    tags = getattr(node.target, "tags", ())
    if name in _RANDOM or torch.Tag.nondeterministic_seeded in tags:
        return name
    if name in _DROPOUT:  # F.dropout(input, p=0.5, training=True): random only when training with p > 0
        p, training = _argument(node, 1, "p", 0.5), _argument(node, 2, "training", True)
        return name if not isinstance(p, int | float) or (p > 0 and training is not False) else None
    if name == "scaled_dot_product_attention":
        p = _argument(node, 4, "dropout_p", 0.0)
        return name if not isinstance(p, int | float) or p > 0 else None
    return None


def _writes_first_argument(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__") and node.target != "requires_grad_"
    if node.op != "call_function":
        return False
    if node.target in _IN_PLACE_FUNCTIONS or node.kwargs.get("inplace") is True:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.arguments and schema.arguments[0].alias_info is not None:
        return bool(schema.arguments[0].alias_info.is_write)
    name = getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


@dataclasses.dataclass(frozen=True)
class SplitFacts:
    """`random_ops`: names of the ops drawing random numbers; `random_outputs`: positions (in the flattened output)
    of outputs whose values depend on them; `random_gradients`: placeholder positions whose gradient may depend on
    them (some op on a path from the input to an output depends on a random value); `mutated_inputs`: placeholder
    positions the graph may write into (directly or through a view); `dropouts`: how many of the random ops are
    plain dropouts (F.dropout, torch.dropout) that draw."""

    random_ops: tuple[str, ...] = ()
    random_outputs: tuple[int, ...] = ()
    random_gradients: tuple[int, ...] = ()
    mutated_inputs: tuple[int, ...] = ()
    dropouts: int = 0

    @property
    def draws_in_dropouts_only(self) -> bool:
        """Whether every random op is a plain dropout (what `scripts.philox_draws.DrawnAsRun` draws again)."""
        return bool(self.random_ops) and set(self.random_ops) == {"dropout"}


def _users_closure(start: list[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = list(start)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(user for user in node.users if user.op != "output")  # the output node joins everything
    return seen


def split_facts(gm: torch.fx.GraphModule) -> SplitFacts:
    """The facts of an FX graph (see `SplitFacts`)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next((n for n in reversed(nodes) if n.op == "output"), None)
    outputs = tree_leaves(output.args[0]) if output is not None and output.args else []

    random = {n: name for n in nodes if (name := draws_random_numbers(n, gm))}
    dependent = _users_closure(list(random))
    random_outputs = tuple(i for i, o in enumerate(outputs) if isinstance(o, torch.fx.Node) and o in dependent)
    random_gradients = tuple(i for i, p in enumerate(placeholders) if dependent and _users_closure([p]) & dependent)

    position = {p: i for i, p in enumerate(placeholders)}
    mutated = set()
    for node in nodes:
        if not _writes_first_argument(node) or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        source = node.args[0]
        while source.op != "placeholder" and op_base_name(source) in _VIEWS and source.args \
                and isinstance(source.args[0], torch.fx.Node):
            source = source.args[0]
        if source in position:
            mutated.add(position[source])
    return SplitFacts(tuple(dict.fromkeys(random.values())), random_outputs, random_gradients, tuple(sorted(mutated)),
                      dropouts=sum(1 for name in random.values() if name == "dropout"))
