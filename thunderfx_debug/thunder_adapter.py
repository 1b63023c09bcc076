"""The only module that reads Thunder internals (splitter, SubgraphInfo, traces, fusion bound symbols).

A Thunder upgrade should touch this file (and `compat`) only. Everything here turns Thunder objects into plain
values or `records`; nothing here keeps references to activations.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from thunderfx_debug import compat
from thunderfx_debug.records import InputMeta, Phase, SplitKind, SplitReason


@dataclasses.dataclass
class SplitPiece:
    """A thunder_N / inductor_N submodule of a split Dynamo graph, with the Thunder objects behind it."""

    name: str
    kind: SplitKind
    original_module: torch.fx.GraphModule  # before compilation (thunder's original_split_graph_module)
    compiled: Callable  # ThunderModule for thunder splits, thunder's ModuleWrapper for inductor ones
    ops: tuple[str, ...]
    input_meta: tuple[InputMeta, ...]
    reasons: list[SplitReason] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FusionRegion:
    """A fusion bound symbol of a final Thunder trace."""

    name: str
    executor: str
    phase: Phase
    ops: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_meta: tuple[InputMeta, ...]
    bsym: Any  # thunder.core.symbol.BoundSymbol; kept for repro writing at flush


def compile_graph(compiler, gm: torch.fx.GraphModule, sample_args: Sequence[Any], inductor_compile: Callable):
    """Splits and compiles `gm` exactly as `ThunderCompiler.__call__` of Thunder 0.2.6 does, but with
    `inductor_compile` for the inductor splits. Returns (split graph module, SubgraphInfo), and appends the
    SubgraphInfo to `compiler.subgraph_infos` as ThunderCompiler does."""
    from thunder import jit
    from thunder.dynamo.compiler import _with_prologue_pruning_transform, is_dynamic_inputs, is_in_torch_compile
    from thunder.dynamo.splitter import _splitter
    from thunder.dynamo.utils import recompile_graph, remove_empty_autocast

    remove_empty_autocast(gm)
    recompile_graph(gm)
    thunder_options = _with_prologue_pruning_transform(
        current_thunder_options=compiler.thunder_options,
        is_torch_compile_without_dynamic=is_in_torch_compile() and not is_dynamic_inputs(sample_args),
    )
    with compat.eager_graph_module_code():
        split_gm, info = _splitter(gm, partial(jit, **thunder_options), inductor_compile, sample_args, thunder_options)
    compiler.subgraph_infos.append(info)
    return split_gm, info


def has_dynamic_inputs(sample_args: Sequence[Any]) -> bool:
    from thunder.dynamo.compiler import is_dynamic_inputs

    return is_dynamic_inputs(sample_args)


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
        return InputMeta(kind="symint", value=value.node.hint)
    elif isinstance(value, bool | int | float):
        return InputMeta(kind=type(value).__name__, value=value)
    elif value is None:
        return InputMeta(kind="none")
    else:
        return InputMeta(kind="other", value=repr(value)[:200])
    return InputMeta(
        kind="tensor",
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
        kind="tensor",
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
        metas.append(input_meta(example) if example is not None else InputMeta(kind="other", value="unknown"))
    return tuple(metas)


_REASON_NODE = re.compile(r"node with name: (?P<node>\S+) and target: (?P<target>.+?)(?: only has| didn't have| has been| is not supported|, see exception|$)")


def split_pieces(info, split_gm: torch.fx.GraphModule) -> tuple[list[SplitPiece], list[SplitReason]]:
    """The splits of a compiled graph in execution order, each with the split reasons of its nodes; and the reasons
    that name no node of any inductor split (kept at graph level so that nothing is lost)."""
    original = info.original_split_graph_module.split_graph_module  # thunder wraps it in _ThunderSplitGraphModule
    pieces: list[SplitPiece] = []
    node_to_piece: dict[str, SplitPiece] = {}
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
        submodule_name = "submod_" + node.name.split("_", 1)[1]
        original_module = getattr(original, submodule_name)
        if kind is SplitKind.THUNDER and info.thunder_compiled_fns_example_inputs:
            metas = tuple(input_meta(m) for m in info.thunder_compiled_fns_example_inputs[thunder_index])
            thunder_index += 1
        else:
            metas = _placeholder_meta(original_module)
        piece = SplitPiece(
            name=node.name,
            kind=kind,
            original_module=original_module,
            compiled=getattr(split_gm, node.name),
            ops=graph_ops(original_module),
            input_meta=metas,
        )
        pieces.append(piece)
        if kind is SplitKind.INDUCTOR:
            for sub_node in original_module.graph.nodes:
                node_to_piece[sub_node.name] = piece
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
        piece = node_to_piece.get(record.node) if record.node else None
        (piece.reasons if piece is not None else unattributed).append(record)
    return pieces, unattributed


def thunder_traces(compiled: Callable) -> tuple[Any | None, Any | None]:
    """The final forward and backward traces Thunder built for the last run of a thunder split (None before it ran)."""
    import thunder

    try:
        forward = thunder.last_traces(compiled)
    except TypeError:  # Thunder's way of saying "not called yet"
        return None, None
    try:
        backward = thunder.last_backward_traces(compiled)
    except TypeError:
        backward = None
    from thunderfx_debug.fusion_timing import without_marks  # the traces as Thunder built them, without timing calls

    return without_marks(forward[-1] if forward else None), without_marks(backward[-1] if backward else None)


def trace_source(trace) -> str:
    return str(trace)


def _proxy_meta(proxy: Any) -> InputMeta:
    from thunder.core.proxies import TensorProxy
    from thunder.core.dtypes import to_torch_dtype

    if isinstance(proxy, TensorProxy):
        from torch._prims_common import make_contiguous_strides_for

        shape = tuple(int(s) for s in proxy.shape)
        return InputMeta(
            kind="tensor",
            shape=shape,
            stride=tuple(make_contiguous_strides_for(shape)),  # proxies carry no strides; fusion inputs are contiguous
            dtype=str(to_torch_dtype(proxy.dtype)),
            device=str(proxy.device.device_str()) if hasattr(proxy.device, "device_str") else str(proxy.device),
            requires_grad=bool(getattr(proxy, "requires_grad", False)),
        )
    value = getattr(proxy, "value", proxy)
    if isinstance(value, bool | int | float):
        return InputMeta(kind=type(value).__name__, value=value)
    return InputMeta(kind="other", value=repr(value)[:200])


def _proxy_name(value: Any) -> str:
    return getattr(value, "name", None) or repr(value)


def fusion_regions(trace, phase: Phase) -> list[FusionRegion]:
    """The fusion regions (nvFusionN, TorchCompileN, ...) of a final trace, in trace order."""
    if trace is None:
        return []
    regions = []
    for bsym in trace.bound_symbols:
        if not bsym.sym.is_fusion:
            continue
        executor = bsym.sym.executor
        regions.append(
            FusionRegion(
                name=bsym.sym.name,
                executor=getattr(executor, "name", str(executor)),
                phase=phase,
                ops=tuple(sub.sym.name for sub in bsym.subsymbols),
                inputs=tuple(_proxy_name(a) for a in bsym.flat_args),
                outputs=tuple(_proxy_name(o) for o in bsym.flat_outs),
                input_meta=tuple(_proxy_meta(a) for a in bsym.flat_args),
                bsym=bsym,
            )
        )
    return regions


def dynamo_graph_facts(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """What Dynamo attached to the graph: compile id, and why the graph ended where it did."""
    from torch._guards import CompileContext

    compile_id = gm.meta.get("dynamo_compile_id") or CompileContext.current_compile_id()
    reason = getattr(gm, "compile_subgraph_reason", None)
    break_reason, user_stack = None, ()
    if reason is not None and getattr(reason, "graph_break", False):
        break_reason = str(reason.reason)
        user_stack = tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in (reason.user_stack or ()))
    return {
        "compile_id": str(compile_id) if compile_id is not None else None,
        "break_reason": break_reason,
        "break_user_stack": user_stack,
        "recompile_reason": _recompile_reason(),
        "frame": _frame_name(),
    }


def _frame_name() -> str | None:
    """The function whose frame Dynamo is compiling, as "forward (/path/models.py:86)"; None where unknown.

    Dynamo's tracing context lists the code objects traced for this graph, the frame's own code first
    (`OutputGraph.__init__` appends it before any inlined function).
    """
    try:
        from torch._dynamo.utils import get_traced_code

        codes = get_traced_code() or []
    except Exception:  # an internal API; the name only makes warnings friendlier
        return None
    if not codes:
        return None
    code = codes[0]
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def _recompile_reason() -> str | None:
    """The guard failure that made Dynamo recompile this frame, where Dynamo recorded one.

    Dynamo (torch 2.5 to 2.13 at least) computes it in `convert_frame._compile` before tracing and stores it only in
    the metrics context of the compilation in progress (`metrics_context.update_outer({"recompile_reason": ...})`),
    which has setters but no getter: we read its `_metrics` dict. None on a first compile, or where it moved.
    """
    try:
        from torch._dynamo.utils import get_metrics_context

        context = get_metrics_context()
        if not context.in_progress():
            return None
        reason = getattr(context, "_metrics", {}).get("recompile_reason")
    except Exception:  # an internal API that moves between torch versions; the reason is optional
        return None
    return str(reason) if reason else None


def thunder_options_repr(thunder_options: dict[str, Any]) -> dict[str, str]:
    """Thunder options as text for the manifest (executors by name)."""
    from thunder import resolve_executors

    described = {}
    for key, value in thunder_options.items():
        if key == "executors" and value is not None:
            described[key] = repr([ex.name for ex in resolve_executors(value)])
        else:
            described[key] = repr(value)
    return described


# ---- repro support (read at flush by `thunderfx_debug.repro`) --------------------------------------------------------


def module_source(gm: torch.fx.GraphModule, class_name: str) -> str:
    """The code of an FX GraphModule as an `nn.Module` class named `class_name`, nested submodules (higher-order
    ops) included: Thunder's own writer of its repro scripts (`thunder.dynamo.utils._readable`)."""
    from thunder.dynamo.utils import _readable

    with compat.eager_graph_module_code():
        return _readable(gm, class_name, print_output=False)


def fx_builtin_imports() -> list[str]:
    """Imports that code generated by torch.fx may use (`inf`, `device`, `pytree`...)."""
    return [v.import_str for v in torch.fx.graph._custom_builtins.values()]


def executor_names(thunder_options: dict[str, Any]) -> list[str] | None:
    """The names of the run's executors (None when the run did not pass any: Thunder's defaults)."""
    from thunder import resolve_executors

    value = thunder_options.get("executors")
    return None if value is None else [ex.name for ex in resolve_executors(value)]


def executor_by_name(name: str):
    """A registered Thunder executor by its name; a repro script's way to get back the run's executors."""
    from thunder.extend import get_executor

    executor = get_executor(name)
    if executor is None:
        raise LookupError(
            f"Thunder has no executor named {name!r} in this process; a custom executor must be registered "
            "(imported) before this script builds its Thunder function"
        )
    return executor


def region_torch_function(bsym, function_name: str) -> tuple[str, dict[str, Any]]:
    """The ops of a fusion region as a Python function of torch calls, and the names that function uses.

    This is the function Thunder's torch.compile executor compiles for a TorchCompileN region
    (`thunder.executors.torch_compile.make_compiled`: a trace of the region's bound symbols, lowered to Thunder's
    torch executor); for an nvFusionN region it is the same lowering of the nvFuser region's ops. We do the lowering
    here rather than call `make_compiled`, which returns only the compiled callable and not its source.
    """
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torchex import ex as torch_ex

    inputs, outputs = list(bsym.flat_args), list(bsym.flat_outs)
    trace = TraceCtx(None)
    trace.args, trace.kwargs = inputs, {}
    trace.names = {getattr(a, "name", None) for a in inputs} - {None}
    with tracectx(trace):
        for proxy in inputs:
            prims.unpack_trivial(proxy, name=proxy.name)
    trace.bound_symbols += list(bsym.subsymbols)
    trace.bound_symbols.append(prims.python_return.bind(outputs, output=None))
    for symbol in trace.bound_symbols:
        if symbol.sym == prims.unpack_trivial:
            continue
        for sub in (symbol, *symbol.subsymbols):
            for out in sub.flat_outs:
                if out is not None and getattr(out, "name", None) and out.name not in trace.names:
                    trace.add_name(out.name)
    trace._siginfo = SigInfo(function_name)
    trace._siginfo.args = [(a.name, None) for a in inputs]
    lowered = transform_for_execution(trace, executors_list=(torch_ex,))
    return lowered.python(include_decorators=False), dict(lowered.python_ctx())


def torch_executor_op_names() -> frozenset[str]:
    from thunder.executors.torchex import ex as torch_ex

    return frozenset(torch_ex.opmap)


def torch_executor_fn(name: str) -> Any:
    """The Python callable behind an operator of Thunder's torch executor (e.g. `shallow_copy`,
    `torch_pad_prim_impl`): some have no importable name (lambdas), so scripts get them from Thunder by name."""
    from thunder.core.symbol import BoundSymbol
    from thunder.executors.torchex import ex as torch_ex

    symbol = torch_ex.opmap[name]
    bound = BoundSymbol(symbol, args=(), kwargs={}, output=None)
    symbol._bind_postprocess(bound)  # the executor puts its implementation in the call context here
    return bound._call_ctx[name]


def nvfuser_repro_source(bsym) -> str:
    """nvFuser's own repro script of the fusion definition an nvFusion region used in the run (imports and
    `fd` built, no inputs): `FusionDefinition.repro_script_for`, as `thunder.dynamo.report` gets it."""
    wrapper = bsym._call_ctx[bsym.sym.name]  # thunder.executors.nvfuserex_impl.FusionDefinitionWrapper
    fd = wrapper.last_used
    if fd is None:
        raise RuntimeError(f"{bsym.sym.name} never ran, so nvFuser built no fusion definition for it")
    writer = getattr(fd, "repro_script_for", None) or getattr(fd, "getReproString", None)
    if writer is None:
        raise RuntimeError("the installed nvFuser cannot write a repro of a fusion definition (no repro_script_for)")
    return writer(None)
