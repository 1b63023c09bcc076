"""The inputs of repro scripts: the file of real values a script loads (THUNDERFX_DEBUG_INPUTS=real, captured by
`recording.capture`), and the code of `make_inputs()` that rebuilds inputs from the recorded metadata with the
`tensor(...)` helper of `script_template`.

Example (one input as a script makes it; not a doctest):

    tensor([2, 16], "int64", low=1, high=127, sentinel=(-100, 0.0625)),  # l_labels_
"""

from __future__ import annotations

import ast
import dataclasses
import io
import math
import re

from typing import TYPE_CHECKING

import torch

from thunderfx_debug.artifacts.repro import fx_facts, script_template
from thunderfx_debug.records import InputKind, InputMeta, storage_span
from thunderfx_debug.recording.capture import INPUTS_FORMAT, Captured
from thunderfx_debug.thunder import scripts as thunder_scripts

if TYPE_CHECKING:
    from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot
    from thunderfx_debug.thunder.traces import FusionRegion

#: Above this many elements beyond what a view reaches, a script builds a storage just large enough for the view.
_STORAGE_SLACK = 64 * 2**20


def with_fx_bounds(gm: torch.fx.GraphModule, metas: tuple[InputMeta, ...]) -> tuple[InputMeta, ...]:
    """`metas` with the index bounds the FX module's ops put on its integer inputs (`fx_facts.index_bounds`)."""
    shapes = {i: m.shape for i, m in enumerate(metas) if m.kind is InputKind.TENSOR}
    return with_index_bounds(metas, fx_facts.index_bounds(gm, shapes))


def split_metas(snapshot: GraphSnapshot, split: SplitSnapshot) -> tuple[InputMeta, ...]:
    """A split's input metadata: as captured on its first call, else as the splitter recorded it with what the
    values were borrowed from the graph inputs it receives directly; with index bounds from its ops. What the repro
    scripts, the flush-time triage and the minimizer make the split's inputs from."""
    compiled = split.state.split
    names = compiled.input_names
    sources: dict[str, InputMeta] = {}
    split_gm = snapshot.state.split_gm
    if split_gm is not None:
        graph_inputs = {node.name: i for i, node in enumerate(split_gm.graph.find_nodes(op="placeholder"))}
        for node in split_gm.graph.find_nodes(op="call_module", target=split.state.name):
            for placeholder, arg in zip(names, node.args):
                index = graph_inputs.get(getattr(arg, "name", None))
                if index is not None and index < len(snapshot.input_meta):
                    sources[placeholder] = snapshot.input_meta[index]
    metas = borrow_value_ranges(split.input_meta, sources, names)
    return with_fx_bounds(compiled.original_module, metas)


def region_metas(split: SplitSnapshot, region: FusionRegion) -> tuple[InputMeta, ...]:
    """A fusion region's input metadata, with the index bounds its ops put on its integer inputs."""
    return with_index_bounds(split.region_metas(region), thunder_scripts.region_index_bounds(region.bsym))


def saved_file(captured: Captured, gradients: Captured | None = None) -> bytes:
    """The bytes of the inputs file a real-input script loads with `torch.load(..., weights_only=True)`; with
    `gradients` (a mismatch script's gradient mismatch), also the incoming gradients ("grad_outputs") and those
    the piece passed on ("grads")."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the non-blocking host copies of `capture.host_copy` are complete from here on
    buffer = io.BytesIO()
    content = {"format": INPUTS_FORMAT, "inputs": captured.inputs, "outputs": captured.outputs}
    if gradients is not None:
        content.update(grad_outputs=gradients.inputs, grads=gradients.outputs)
    torch.save(content, buffer)
    return buffer.getvalue()


# ---- code that makes inputs in a script -----------------------------------------------------------------------------


def _contiguous(shape, stride) -> bool:
    expected = 1
    for size, step in reversed(list(zip(shape, stride))):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _short(value):
    """A float bound with 6 significant digits (the script stays readable; the draw stays within the run's range)."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _value_arguments(meta: InputMeta, dtype: torch.dtype) -> dict:
    """The keyword arguments of `tensor(...)` that say how to draw the values (see `script_template.tensor`)."""
    if meta.value is not None and not meta.shape:
        return {"value": meta.value}
    low, high = _short(_finite(meta.min_value)), _short(_finite(meta.max_value))
    if dtype is torch.bool:
        if meta.true_fraction is not None:
            return {"fraction_true": round(meta.true_fraction, 6)}
        return {}
    if dtype.is_floating_point or dtype.is_complex:
        if low is None or high is None:
            return {}
        return {"value": low} if low == high else {"low": low, "high": high}
    # Integers: the run's range; a single negative value (a sentinel such as ignore_index) at its frequency; else
    # the size of the dimension the input indexes; else [0, 9].
    if low is None or high is None:
        return {"low": 0, "high": meta.index_bound - 1} if meta.index_bound else {}
    if low == high:
        return {"value": int(low)}
    arguments: dict = {}
    if meta.sentinel is not None and meta.sentinel_fraction:
        arguments["low"] = meta.nonnegative_min if meta.nonnegative_min is not None else int(high)
        arguments["high"] = int(high)
        arguments["sentinel"] = (meta.sentinel, round(meta.sentinel_fraction, 6))
    else:
        arguments["low"], arguments["high"] = int(low), int(high)
    if meta.true_fraction is not None and low == 0 and high == 1:
        arguments["fraction_true"] = round(meta.true_fraction, 6)
    return arguments


def tensor_call(meta: InputMeta) -> str:
    """The `tensor(...)` call that makes an input like the recorded one: its layout exactly, its values drawn like
    the run's (see `_value_arguments`)."""
    dtype = getattr(torch, meta.dtype.replace("torch.", ""))
    shape, stride = list(meta.shape), list(meta.stride)
    parts = [repr(shape), repr(meta.dtype.replace("torch.", ""))]
    if stride and not _contiguous(shape, stride):
        parts.append(f"stride={stride!r}")
    if meta.storage_offset:
        parts.append(f"offset={meta.storage_offset}")
    reach = meta.storage_offset + storage_span(shape, stride or shape)
    if meta.storage_size is not None and reach < meta.storage_size <= reach + _STORAGE_SLACK:
        parts.append(f"storage={meta.storage_size}")
    if meta.device and meta.device != "cpu":
        parts.append(f"device={meta.device!r}")
    if meta.requires_grad and (dtype.is_floating_point or dtype.is_complex):
        parts.append("requires_grad=True")
    parts += [f"{key}={value!r}" for key, value in _value_arguments(meta, dtype).items()]
    return f"tensor({', '.join(parts)})"


def value_code(meta: InputMeta) -> str:
    """An expression for a non-tensor input, as the value it was."""
    if meta.kind in (InputKind.INT, InputKind.FLOAT, InputKind.BOOL, InputKind.SYMINT):
        if meta.value is None:
            default = {InputKind.FLOAT: "0.0", InputKind.BOOL: "False"}.get(meta.kind, "0")
            return f"{default}  # the run's value was not recorded (its trace holds no value for it)"
        return repr(meta.value)
    if meta.kind is InputKind.COMPLEX:
        real, imaginary = meta.value
        return f"complex({real!r}, {imaginary!r})"
    if meta.kind is InputKind.NONE:
        return "None"
    if meta.kind is InputKind.DTYPE:
        return str(meta.value)
    if meta.kind is InputKind.DEVICE:
        return f"torch.device({meta.value!r})"
    if meta.kind is InputKind.SIZE:
        return f"torch.Size({list(meta.value)!r})"
    if meta.kind is InputKind.TUPLE:
        return repr(tuple(meta.value))
    return f"None  # the run passed {meta.value}: not reproducible from metadata, give it by hand"


def make_inputs_code(metas, names=(), taken=()) -> str:
    """The body of `make_inputs()`: a list of one expression per input, with its name as a comment; the inputs at
    the positions `taken` are `run[i]`, the run's own values (a list `run` the script loads, see `run_integers`)."""
    lines = []
    for i, meta in enumerate(metas):
        if i in taken:
            code = f"run[{i}]  # as the run passed it"
        else:
            code = tensor_call(meta) if meta.kind is InputKind.TENSOR else value_code(meta)
        name = names[i] if i < len(names) else f"input {i}"
        if "  #" in code:
            expression, comment = code.split("  #", 1)
            lines.append(f"{expression},  # {name}:{comment}")
        else:
            lines.append(f"{code},  # {name}")
    return "return [\n" + "".join(f"    {line}\n" for line in lines) + "]"


def run_integers(captured: Captured | None, metas) -> dict[int, dict]:
    """Input position -> the run's own values (host copies, `Captured.integers`) of the integer and bool inputs of a
    piece that fit its `metas` (same shape and dtype: a capture may be of another version of the piece). A script
    takes these rather than drawing them: they index, select and mask, and a draw within their range keeps neither
    what they index (T5's relative-position buckets, computed from several inputs) nor what they are (a permutation).
    """
    if captured is None:
        return {}
    taken = {}
    for i, saved in captured.integers.items():
        meta = metas[i] if i < len(metas) else None
        if (meta is not None and meta.kind is InputKind.TENSOR and tuple(saved["shape"]) == tuple(meta.shape)
                and str(saved["flat"].dtype) == meta.dtype):
            taken[i] = saved
    return taken


def run_integers_file(taken: dict[int, dict], count: int) -> bytes:
    """The inputs file of a script whose inputs `taken` are the run's own values, the others drawn (None there)."""
    return saved_file(Captured(inputs=[taken.get(i) for i in range(count)]))


def borrow_value_ranges(metas, sources: dict[str, InputMeta], names) -> tuple[InputMeta, ...]:
    """`metas` with what the values were taken from `sources` by input name, where a meta has none of its own (the
    inputs of a piece that was not captured often come straight from inputs of its graph, which were)."""
    value_fields = ("min_value", "max_value", "nonnegative_min", "sentinel", "sentinel_fraction", "true_fraction")
    result = []
    for meta, name in zip(metas, names):
        source = sources.get(name)
        if (meta.kind is InputKind.TENSOR and meta.min_value is None and meta.true_fraction is None
                and source is not None and source.kind is InputKind.TENSOR and source.dtype == meta.dtype
                and (source.min_value is not None or source.true_fraction is not None)):
            meta = dataclasses.replace(meta, **{f: getattr(source, f) for f in value_fields})
        result.append(meta)
    result += metas[len(result):]
    return tuple(result)


def with_index_bounds(metas, bounds: dict[int, int]) -> tuple[InputMeta, ...]:
    """`metas` with `index_bound` set for the inputs (by position) whose consumer indexes a dimension of that size."""
    return tuple(dataclasses.replace(m, index_bound=bounds[i]) if i in bounds and m.kind is InputKind.TENSOR else m
                 for i, m in enumerate(metas))


# ---- nvFuser's definition ---------------------------------------------------------------------------------------------

_DEFINE = re.compile(r"define_(tensor|scalar|vector)\(")


def nvfuser_declared_inputs(fusion_definition_code: str) -> list[dict] | None:
    """The inputs an nvFuser fusion definition declares, in order, as its repro text writes them (legacy `nvfuser`
    and `nvfuser_direct` both): `{"kind": "tensor", "shape", "contiguity", "stride_order", "dtype", "is_cpu"}` per
    `fd.define_tensor(...)`, `{"kind": "scalar", "dtype"}` per symbolic `fd.define_scalar(None, ...)`. None where
    the text cannot be read that way (it does not parse, or declares a vector of scalars).

    Example:
        >>> nvfuser_declared_inputs("T0 = fd.define_tensor(shape=[1, 4], contiguity=[None, True], dtype=DataType.Float, "
        ...                         "is_cpu=False, stride_order=[1, 0])\\nS1 = fd.define_scalar(None, dtype=DataType.Int)")
        [{'kind': 'tensor', 'shape': [1, 4], 'contiguity': [None, True], 'stride_order': [1, 0], 'dtype': 'Float', 'is_cpu': False}, {'kind': 'scalar', 'dtype': 'Int'}]
    """
    try:
        tree = ast.parse(fusion_definition_code)
    except SyntaxError:
        return None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in ("define_tensor", "define_scalar", "define_vector")]
    declared = []
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        keywords = {k.arg: k.value for k in call.keywords}
        dtype = keywords.get("dtype")
        dtype_name = dtype.attr if isinstance(dtype, ast.Attribute) else None
        if call.func.attr == "define_vector":
            return None
        if call.func.attr == "define_scalar":
            if call.args and not (isinstance(call.args[0], ast.Constant) and call.args[0].value is None):
                continue  # a constant, not an input
            declared.append({"kind": "scalar", "dtype": dtype_name})
            continue
        try:
            entry = {"kind": "tensor", "shape": ast.literal_eval(keywords["shape"]),
                     "contiguity": ast.literal_eval(keywords["contiguity"]),
                     "stride_order": ast.literal_eval(keywords["stride_order"]) if "stride_order" in keywords else [],
                     "dtype": dtype_name,
                     "is_cpu": ast.literal_eval(keywords["is_cpu"]) if "is_cpu" in keywords else False}
        except (KeyError, ValueError):
            return None
        declared.append(entry)
    return declared


def in_nvfuser_layouts(metas: tuple[InputMeta, ...], declared: list[dict]) -> tuple[tuple[InputMeta, ...], list[int]]:
    """`metas` with the strides nvFuser's definition declares where the recorded layout is not one it binds, and
    the positions of the captured inputs among those.

    A region whose inputs were not captured has the layouts of its trace's proxies, which carry no strides: they
    take the definition's (a gap where it declares a dim not contiguous). A captured layout is the run's own, from
    the region's first call, and the definition is nvFuser's for its last call (Thunder's
    `FusionDefinitionWrapper.last_used`: nvFuser compiles one definition per layout the inputs come in). Where the
    definition would refuse the captured layout, the two calls were laid out differently, and the script runs the
    definition on inputs laid out as it declares. Metas are returned unchanged where the definition does not match
    them (count or rank).

    Example (a transposed attention input, captured contiguous by a call before the definition's):
        >>> declared = [{"kind": "tensor", "shape": [2, 3, 8, 4], "contiguity": [True] * 4, "stride_order": [3, 1, 2, 0]}]
        >>> meta = InputMeta(kind="tensor", shape=(2, 3, 8, 4), stride=(96, 32, 4, 1), storage_size=192)
        >>> metas, relaid = in_nvfuser_layouts((meta,), declared)
        >>> metas[0].stride, relaid
        ((96, 4, 12, 1), [0])
    """
    if len(declared) != len(metas):
        return metas, []
    result, relaid = list(metas), []
    for index, (meta, entry) in enumerate(zip(metas, declared)):
        if meta.kind is not InputKind.TENSOR or entry["kind"] != "tensor" or len(entry["shape"]) != len(meta.shape):
            continue
        captured = meta.storage_size is not None
        if captured and not script_template.nvfuser_layout_mismatch(list(meta.shape), list(meta.stride), entry):
            continue  # the run's own layout, which the definition binds
        stride = tuple(script_template.nvfuser_strides(list(meta.shape), entry["contiguity"], entry["stride_order"]))
        if stride != tuple(meta.stride):
            result[index] = dataclasses.replace(meta, stride=stride)
            if captured:
                relaid.append(index)
    return tuple(result), relaid
