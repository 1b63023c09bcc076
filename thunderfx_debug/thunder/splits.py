"""The splits of a graph ThunderFX compiled (thunder_N / inductor_N submodules), their ops, inputs and split
reasons, read from Thunder's SubgraphInfo."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch

from thunderfx_debug.records import InputKind, InputMeta, SplitKind, SplitReason
from thunderfx_debug.thunder.provenance import module_sources


@dataclasses.dataclass
class CompiledSplit:
    """A thunder_N / inductor_N submodule of a split Dynamo graph, with the Thunder objects behind it; `sources` are
    the lines of the model's code its ops came from (see `provenance`)."""

    name: str
    kind: SplitKind
    original_module: torch.fx.GraphModule  # before compilation (thunder's original_split_graph_module)
    compiled: Callable  # ThunderModule for thunder splits, thunder's ModuleWrapper for inductor ones
    ops: tuple[str, ...]
    input_meta: tuple[InputMeta, ...]
    reasons: list[SplitReason] = dataclasses.field(default_factory=list)
    sources: tuple[str, ...] = ()

    @property
    def input_names(self) -> list[str]:
        """The names of the split's inputs, as its FX module's placeholders name them."""
        return [node.name for node in self.original_module.graph.find_nodes(op="placeholder")]


_QUALIFIED_NAME_PREFIXES = (("_operator.", "operator."), ("torch._C._nn.", "torch.nn.functional."),
                            ("torch._C._linalg.linalg_", "torch.linalg."), ("torch._C._VariableFunctionsClass.", "torch."))


def op_name(node: torch.fx.Node) -> str:
    """A readable, stable name for the op of an FX node: `torch.sin`, `Tensor.view`, `operator.add`."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"module:{node.target}"
    try:
        name = torch.fx.node._get_qualified_name(node.target)
    except Exception:  # targets without a module path (some builtins, partials)
        name = getattr(node.target, "__name__", None) or str(node.target)
    for prefix, readable in _QUALIFIED_NAME_PREFIXES:
        if name.startswith(prefix):
            return readable + name[len(prefix):]
    return name


def graph_ops(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    return tuple(op_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def sequence_of_numbers(value: Any) -> list[int | float | bool] | None:
    """The numbers of a torch.Size or a tuple of numbers (symbolic ones by their hint), None for anything else: a
    split hands the next one the size of a tensor where shapes are dynamic."""
    if not isinstance(value, tuple):
        return None
    numbers = []
    for item in value:
        if isinstance(item, torch.SymInt | torch.SymFloat | torch.SymBool):
            item = item.node.hint
        if not isinstance(item, bool | int | float):
            return None
        numbers.append(item)
    return numbers


def input_meta(value: Any) -> InputMeta:
    """Metadata of one input as Thunder's report module describes it (value range included for real tensors)."""
    from thunder.dynamo.utils import ExampleInputMetaData, input_to_example_input_meta

    if isinstance(value, ExampleInputMetaData):
        meta = value
    elif isinstance(value, torch.Tensor):
        if value.device.type == "meta" or isinstance(value, torch._subclasses.FakeTensor):
            return _tensor_meta_without_values(value)
        # Thunder reads no value range of tensor subclasses, nn.Parameter included; a Parameter's data is a plain
        # tensor, and repro scripts need the range of the weights to make realistic ones.
        meta = input_to_example_input_meta(value.data if isinstance(value, torch.nn.Parameter) else value)
    elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return InputMeta(kind=InputKind.SYMINT, value=value.node.hint)
    elif isinstance(value, bool | int | float):
        return InputMeta(kind=InputKind(type(value).__name__), value=value)
    elif value is None:
        return InputMeta(kind=InputKind.NONE)
    elif sequence_of_numbers(value) is not None:  # a size a split hands the next where shapes are dynamic
        return InputMeta(kind=InputKind.SIZE if isinstance(value, torch.Size) else InputKind.TUPLE,
                         value=sequence_of_numbers(value))
    else:
        return InputMeta(kind=InputKind.OTHER, value=repr(value)[:200])
    return InputMeta(
        kind=InputKind.TENSOR,
        shape=tuple(int(s) for s in meta.shape),
        stride=tuple(int(s) for s in meta.strides),
        storage_offset=int(meta.storage_offset()),
        dtype=str(meta.dtype),
        device=str(meta.device),
        requires_grad=bool(value.requires_grad if isinstance(value, torch.Tensor) else meta.requires_grad),
        min_value=meta.min_val,
        max_value=meta.max_val,
    )


def _tensor_meta_without_values(t: torch.Tensor) -> InputMeta:
    def concrete(values):
        return tuple(int(getattr(v, "node", None).hint) if isinstance(v, torch.SymInt) else int(v) for v in values)

    return InputMeta(
        kind=InputKind.TENSOR,
        shape=concrete(t.shape),
        stride=concrete(t.stride()),
        storage_offset=int(t.storage_offset()),
        dtype=str(t.dtype),
        device=str(t.device),
        requires_grad=bool(t.requires_grad),
    )


def _placeholder_meta(gm: torch.fx.GraphModule) -> tuple[InputMeta, ...]:
    from thunder.dynamo.utils import _get_example_inputs_from_placeholder

    metas = []
    for node in gm.graph.find_nodes(op="placeholder"):
        example = _get_example_inputs_from_placeholder(node, only_metadata=True)
        metas.append(input_meta(example) if example is not None else InputMeta(kind=InputKind.OTHER, value="unknown"))
    return tuple(metas)


_REASON_NODE = re.compile(r"node with name: (?P<node>\S+) and target: (?P<target>.+?)(?: only has| didn't have| has been| is not supported|, see exception|$)")


def compiled_splits(info, split_gm: torch.fx.GraphModule) -> tuple[list[CompiledSplit], list[SplitReason]]:
    """The splits of a compiled graph in execution order, each with the split reasons of its nodes; and the reasons
    that name no node of any inductor split (kept at graph level so that nothing is lost)."""
    original = info.original_split_graph_module.split_graph_module  # thunder wraps it in _ThunderSplitGraphModule
    splits: list[CompiledSplit] = []
    node_to_split: dict[str, CompiledSplit] = {}
    node_ops: dict[str, str] = {}
    thunder_index = 0
    for node in split_gm.graph.nodes:
        if node.op != "call_module":
            continue
        if node.name.startswith("thunder_"):
            kind = SplitKind.THUNDER
        elif node.name.startswith("inductor_"):
            kind = SplitKind.INDUCTOR
        else:
            continue
        original_module = getattr(original, "submod_" + node.name.split("_", 1)[1])
        if kind is SplitKind.THUNDER and info.thunder_compiled_fns_example_inputs:
            metas = tuple(input_meta(m) for m in info.thunder_compiled_fns_example_inputs[thunder_index])
            thunder_index += 1
        else:
            metas = _placeholder_meta(original_module)
        split = CompiledSplit(
            name=node.name,
            kind=kind,
            original_module=original_module,
            compiled=getattr(split_gm, node.name),
            ops=graph_ops(original_module),
            input_meta=metas,
            sources=module_sources(original_module),
        )
        splits.append(split)
        if kind is SplitKind.INDUCTOR:
            for sub_node in original_module.graph.nodes:
                node_to_split[sub_node.name] = split
        node_ops.update((n.name, op_name(n)) for n in original_module.graph.nodes if n.op.startswith("call_"))
    unattributed: list[SplitReason] = []
    for reason in info.split_reasons or ():
        match = _REASON_NODE.search(reason.info or "")
        record = SplitReason(
            type=reason.reason_type.name,
            info=reason.info or "",
            exception=reason.exception,
            node=match["node"] if match else None,
            op=(node_ops.get(match["node"]) or match["target"]) if match else None,
        )
        split = node_to_split.get(record.node) if record.node else None
        (split.reasons if split is not None else unattributed).append(record)
    return splits, unattributed
