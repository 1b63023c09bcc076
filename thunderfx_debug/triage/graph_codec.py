"""An FX GraphModule as data, so that a child process gets Dynamo's GraphModule as it is: the same nodes, names and
code, without tracing its code again.

torch.fx's own pickling (`GraphModule.__reduce__`) keeps only the generated code and traces it again on load with
`symbolic_trace`, which cannot trace every graph Dynamo makes (an item assignment, `x[:, 0] = 2`, fails on a
Proxy), and a `torch.fx.Graph` does not pickle (its namespace holds weak dictionaries). So the graph is written node
by node: op, name, target and arguments, with references to earlier nodes by name; submodules (the bodies of
higher-order ops) the same way; attributes that `get_attr` reads by value. Targets are pickled by reference (their
module and name); torch's operators (`torch.ops.aten.add.Tensor`, whose overloads do not pickle, and higher-order
operators) by their names under `torch.ops` (`torch_private.operator_key`), a custom op (transformers' MoE kernels)
with the module that registers it.

What is read back runs code: the file is the parent's, written for its own child into a private folder; a dump is
never read this way.

Example:
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    >>> again = decode(encode(gm))
    >>> again.code == gm.code, again(torch.tensor([-1.0, 2.0])).tolist()
    (True, [1.0, 3.0])
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
from typing import Any

import torch
import torch.fx

from thunderfx_debug.thunder import torch_private
from thunderfx_debug.thunder.script_support import eager_graph_module_code

#: Bumped when the layout of what `encode` writes changes.
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class _NodeRef:
    name: str


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        key = torch_private.operator_key(obj)
        if key is None:
            return NotImplemented
        custom = torch_private.custom_op_module(obj)
        return (_custom_operator, (custom[1], *key)) if custom else (torch_private.operator_from_key, key)


def _custom_operator(module: str, namespace: str, name: str, overload: str | None):
    """A custom op (`torch.library.custom_op`), after importing the module that defines it (where it registers)."""
    importlib.import_module(module)
    return torch_private.operator_from_key(namespace, name, overload)


def _graph_data(gm: torch.fx.GraphModule) -> dict[str, Any]:
    nodes = []
    attributes: dict[str, Any] = {}
    submodules: dict[str, Any] = {}
    for node in gm.graph.nodes:
        args = torch.fx.node.map_arg(node.args, lambda n: _NodeRef(n.name))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: _NodeRef(n.name))
        nodes.append((node.op, node.name, node.target, args, kwargs, node.type,
                      {k: node.meta[k] for k in ("stack_trace",) if k in node.meta}))
        if node.op == "get_attr":
            attributes[node.target] = _attribute(gm, node.target)
        elif node.op == "call_module":
            child = gm.get_submodule(node.target)
            if not isinstance(child, torch.fx.GraphModule):
                raise TypeError(f"submodule {node.target} is a {type(child).__name__}, not an FX GraphModule")
            submodules[node.target] = _graph_data(child)
    codegen = gm.graph._codegen
    return {"class": type(gm).__name__, "nodes": nodes, "attributes": attributes, "submodules": submodules,
            "codegen": None if type(codegen) is torch.fx.graph.CodeGen else codegen}


def _attribute(gm: torch.nn.Module, target: str) -> Any:
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    if isinstance(value, torch.fx.GraphModule):
        return ("graph_module", _graph_data(value))
    if isinstance(value, torch.nn.Parameter):
        return ("parameter", value.detach(), value.requires_grad)
    return ("value", value)


def encode(gm: torch.fx.GraphModule) -> bytes:
    """`gm` as bytes that `decode` makes into the same GraphModule (see the module docstring).

    Raises:
        TypeError, pickle.PicklingError, AttributeError: a target or attribute that cannot be pickled by reference
            (a lambda, a local function), or a submodule that is not a GraphModule.
    """
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump({"format": FORMAT, "graph": _graph_data(gm)})
    return buffer.getvalue()


def decode(data: bytes) -> torch.fx.GraphModule:
    """The GraphModule `encode` wrote (its code generated at once; see `script_support.eager_graph_module_code`)."""
    content = pickle.loads(data)
    if content.get("format") != FORMAT:
        raise ValueError(f"a graph of format {content.get('format')!r}; this code reads format {FORMAT}")
    return _build(content["graph"])


def _build(data: dict[str, Any]) -> torch.fx.GraphModule:
    root = torch.nn.Module()
    for target, sub in data["submodules"].items():
        _set(root, target, _build(sub))
    for target, (kind, *value) in data["attributes"].items():
        if kind == "graph_module":
            attribute = _build(value[0])
        elif kind == "parameter":
            attribute = torch.nn.Parameter(value[0], requires_grad=value[1])
        else:
            attribute = value[0]
        _set(root, target, attribute)
    graph = torch.fx.Graph()
    if data["codegen"] is not None:
        graph._codegen = data["codegen"]
    made: dict[str, torch.fx.Node] = {}

    def resolve(value):
        if isinstance(value, _NodeRef):
            return made[value.name]
        if isinstance(value, (list, tuple)):
            resolved = [resolve(v) for v in value]
            return type(value)(resolved) if not hasattr(value, "_fields") else type(value)(*resolved)
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(resolve(value.start), resolve(value.stop), resolve(value.step))
        return value

    for op, name, target, args, kwargs, type_expr, meta in data["nodes"]:
        node = graph.create_node(op, resolve(target), resolve(args), resolve(kwargs), name=name, type_expr=type_expr)
        node.meta.update(meta)
        made[name] = node
    with eager_graph_module_code():
        return torch.fx.GraphModule(root, graph, class_name=data["class"])


def _set(root: torch.nn.Module, target: str, value: Any) -> None:
    *path, leaf = target.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if isinstance(value, torch.nn.Module):
        module.add_module(leaf, value)
    elif isinstance(value, torch.nn.Parameter):
        module.register_parameter(leaf, value)
    elif isinstance(value, torch.Tensor):
        module.register_buffer(leaf, value)
    else:
        setattr(module, leaf, value)
