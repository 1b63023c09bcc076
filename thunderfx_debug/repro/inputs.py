"""The inputs of repro scripts: the real tensors of a first call (captured on the training path, cheaply), and the
code that makes inputs in a script, from those tensors or from the recorded metadata.

Capture (`capture`, `capture_outputs`, `capture_split`) happens once per graph and per split, on its first call,
only with THUNDERFX_DEBUG_INPUTS=real. It copies each tensor's storage span to the host without waiting for the
device (`non_blocking` into pinned memory on CUDA; copies on the same stream are ordered before any later in-place
update, e.g. the optimizer's); the copies are read at flush, after the recorder waited for the device. Beyond
THUNDERFX_DEBUG_INPUTS_MAX_MB (counted per graph and per split, inputs and outputs together) nothing is kept and the
scripts fall back to metadata, saying so.

Example (what a script with real inputs does; not a doctest):

    saved = torch.load("inputs/graph0_inputs.pt", weights_only=True)
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import textwrap
from typing import Any

import torch

from thunderfx_debug.records import InputMeta

#: Version of the saved inputs file; `runtime.load_inputs` refuses others.
INPUTS_FORMAT = 1


@dataclasses.dataclass
class Captured:
    """The values of a piece's first call: host copies (see `_host_copy`) or Python scalars. `skipped` says why
    nothing was kept (over the cap, an input of a kind that cannot be saved), and then `inputs` is None."""

    inputs: list[Any] | None = None
    outputs: list[Any] | None = None
    nbytes: int = 0
    max_mb: float = 0.0
    skipped: str | None = None


def _span(t: torch.Tensor) -> int:
    """Elements of storage a strided tensor reaches from its storage offset."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def _host_copy(t: torch.Tensor) -> dict[str, Any]:
    """The storage span of `t` copied to the host, with what rebuilds the tensor (any strides, expanded ones too)."""
    flat = t.detach().as_strided((_span(t),), (1,), t.storage_offset())
    if flat.device.type == "cuda":
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)  # no synchronisation here; the recorder waits for the device at flush
    else:
        host = flat.clone()
    return {
        "flat": host,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "device": str(t.device),
        "requires_grad": bool(t.requires_grad),
    }


def _nbytes(t: torch.Tensor) -> int:
    return _span(t) * t.element_size()


def _copy_values(values, budget: int) -> tuple[list[Any] | None, int, str | None]:
    """Host copies of tensors and scalars; (None, bytes, reason) when they are over `budget` bytes or unsupported."""
    flat = list(values)
    total = 0
    for value in flat:
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided or type(value) not in (torch.Tensor, torch.nn.Parameter):
                return None, total, f"an input of type {type(value).__name__} ({value.layout}) cannot be saved"
            total += _nbytes(value)
        elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            continue
        elif not isinstance(value, bool | int | float | type(None)):
            return None, total, f"an input of type {type(value).__name__} cannot be saved"
    if total > budget:
        return None, total, f"{total / 2**20:.1f} MB is over THUNDERFX_DEBUG_INPUTS_MAX_MB"
    copies = []
    for value in flat:
        if isinstance(value, torch.Tensor):
            copies.append(_host_copy(value))
        elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            copies.append(value.node.hint)
        else:
            copies.append(value)
    return copies, total, None


def _flat_outputs(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _flat_outputs(item)]
    return [value]


def capture(state, args, max_mb: float) -> None:
    """Keeps host copies of a graph's first-call inputs in `state.real_inputs` (called by the backend)."""
    state.real_inputs = _capture(args, max_mb)


def capture_outputs(state, outputs) -> None:
    """Adds the outputs of that first call, within what is left of the cap."""
    _add_outputs(state.real_inputs, outputs)


def capture_split(split_state, args, max_mb: float) -> None:
    """The same for a split's first call (its inputs; `capture_split_outputs` adds its outputs)."""
    split_state.real_inputs = _capture(args, max_mb)


def capture_split_outputs(split_state, outputs) -> None:
    _add_outputs(split_state.real_inputs, outputs)


def _capture(args, max_mb: float) -> Captured:
    budget = int(max_mb * 2**20)
    copies, nbytes, skipped = _copy_values(args, budget)
    return Captured(inputs=copies, nbytes=nbytes, max_mb=max_mb, skipped=skipped)


def _add_outputs(captured: Captured | None, outputs) -> None:
    if captured is None or captured.inputs is None:
        return
    budget = int(captured.max_mb * 2**20) - captured.nbytes
    copies, nbytes, skipped = _copy_values(_flat_outputs(outputs), budget)
    captured.outputs = copies
    if copies is not None:
        captured.nbytes += nbytes


def saved_file(captured: Captured) -> bytes:
    """The bytes of the inputs file a real-input script loads with `torch.load(..., weights_only=True)`."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the non-blocking host copies of `_host_copy` are complete from here on
    buffer = io.BytesIO()
    torch.save({"format": INPUTS_FORMAT, "inputs": captured.inputs, "outputs": captured.outputs}, buffer)
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
    # Thunder's arg_like writes the bound as Python text: `-inf` or `nan` would not parse, and make_tensor refuses them.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _tensor_code(meta: InputMeta) -> str:
    """Code for a random tensor like the recorded one, written by Thunder's `arg_like` (the helper of its own repro
    writer) from an `ExampleInputMetaData`. Without a recorded range, floating-point tensors get [-1, 1] and integer
    ones [0, 10): negative values are almost never valid where integers feed a fusion (indices, counts)."""
    from thunder.dynamo.utils import ExampleInputMetaData, arg_like

    dtype = getattr(torch, meta.dtype.replace("torch.", ""))
    low, high = _finite(meta.min_value), _finite(meta.max_value)
    if low is None or high is None:
        low = high = None
        if dtype.is_floating_point:
            low, high = -1.0, 1.0  # make_tensor's default [-9, 9] makes activations and saved statistics explode
        elif not dtype.is_complex and dtype is not torch.bool:
            low, high = 0, 10
    elif not dtype.is_floating_point and dtype is not torch.bool and low != high:
        high = high + 1  # make_tensor's `high` is exclusive for integers; the recorded maximum is a value the run saw
    span = 1 + sum((size - 1) * stride for size, stride in zip(meta.shape, meta.stride)) if all(meta.shape) else 0
    example = ExampleInputMetaData(
        requires_grad=meta.requires_grad,
        layout=torch.strided,
        device=meta.device,
        dtype=dtype,
        shape=list(meta.shape),
        storage_shape=[meta.storage_offset + span],
        strides=list(meta.stride),
        is_contiguous=_contiguous(meta.shape, meta.stride),
        _storage_offset=meta.storage_offset,
        min_val=low,
        max_val=high,
    )
    return arg_like(example)


def meta_inputs_code(metas) -> str:
    """The body of `make_inputs()` for inputs made from metadata."""
    lines = []
    for i, meta in enumerate(metas):
        if meta.kind == "tensor":
            lines.append(_tensor_code(meta))
        elif meta.kind in ("int", "float", "bool", "symint"):
            lines.append(f"{meta.value!r},")
        elif meta.kind == "none":
            lines.append("None,")
        else:
            lines.append(f"None,  # input {i} was {meta.value}: not reproducible from metadata, give it by hand")
    return "return [\n" + textwrap.indent("\n".join(lines), "    ") + "\n]"


def borrow_value_ranges(metas, sources: dict[str, InputMeta], names) -> tuple[InputMeta, ...]:
    """`metas` with value ranges taken from `sources` by input name, where a meta has none of its own (split and
    fusion inputs often come straight from graph inputs, whose values the backend saw)."""
    result = []
    for meta, name in zip(metas, names):
        source = sources.get(name)
        if (
            meta.kind == "tensor"
            and meta.min_value is None
            and source is not None
            and source.kind == "tensor"
            and source.dtype == meta.dtype
            and source.min_value is not None
        ):
            meta = dataclasses.replace(meta, min_value=source.min_value, max_value=source.max_value)
        result.append(meta)
    result += metas[len(result):]
    return tuple(result)


def in_nvfuser_layouts(metas: tuple[InputMeta, ...], fusion_definition_code: str) -> tuple[InputMeta, ...]:
    """`metas` with each tensor's strides set to the memory layout nvFuser's fusion definition declares for it.

    Thunder builds an nvFuser definition for the layouts of the tensors it first ran with (`stride_order`), and
    nvFuser refuses tensors in another layout ("stride mismatch with contiguity info"); the region's recorded metas
    are contiguous (Thunder's proxies carry no strides). The k-th `fd.define_tensor(...)` of nvFuser's repro is the
    k-th tensor input. Metas are returned unchanged when the definition does not match them (count or rank).

    Example:
        >>> meta = InputMeta(kind="tensor", shape=(4, 2, 64, 32), stride=(4096, 2048, 32, 1))
        >>> code = "T0 = fd.define_tensor(shape=[4, 2, 64, 32], contiguity=[True, True, True, True], stride_order=[3, 1, 2, 0])"
        >>> in_nvfuser_layouts((meta,), code)[0].stride
        (4096, 32, 64, 1)
    """
    orders = [
        [int(x) for x in found.group(1).split(",") if x.strip()] if (found := _STRIDE_ORDER.search(call)) else None
        for call in _DEFINE_TENSOR.findall(fusion_definition_code)
    ]
    tensors = [i for i, m in enumerate(metas) if m.kind == "tensor"]
    if len(orders) != len(tensors):
        return metas
    from torch._prims_common import make_contiguous_strides_for

    result = list(metas)
    for index, order in zip(tensors, orders):
        meta = metas[index]
        if order is None or sorted(order) != list(range(len(meta.shape))):
            continue
        outermost_first = sorted(range(len(order)), key=order.__getitem__, reverse=True)  # stride_order 0: innermost
        stride = [0] * len(meta.shape)
        for dim, step in zip(outermost_first, make_contiguous_strides_for([meta.shape[d] for d in outermost_first])):
            stride[dim] = step
        result[index] = dataclasses.replace(meta, stride=tuple(stride))
    return tuple(result)


_DEFINE_TENSOR = re.compile(r"define_tensor\((.*?)\)", re.S)
_STRIDE_ORDER = re.compile(r"stride_order\s*=\s*\[([^\]]*)\]")
