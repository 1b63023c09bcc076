"""The inputs of repro scripts: the file of real tensors a script loads (THUNDERFX_DEBUG_INPUTS=real, captured by
`recording.capture`), and the code that makes inputs in a script from the recorded metadata.

Example (what a script with real inputs does; not a doctest):

    saved = torch.load("inputs/graph0_inputs.pt", weights_only=True)
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import textwrap

import torch

from thunderfx_debug.records import InputKind, InputMeta, storage_span
from thunderfx_debug.recording.capture import Captured
from thunderfx_debug.thunder.scripts import tensor_like_code

#: Version of the saved inputs file; `runtime.load_inputs` refuses others.
INPUTS_FORMAT = 1


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
    """Code for a random tensor like the recorded one (see `thunder.scripts.tensor_like_code`). Without a recorded
    range, floating-point tensors get [-1, 1] and integer ones [0, 10): negative values are almost never valid where
    integers feed a fusion (indices, counts)."""
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
    return tensor_like_code(
        shape=meta.shape,
        stride=meta.stride,
        storage_offset=meta.storage_offset,
        storage_size=meta.storage_offset + storage_span(meta.shape, meta.stride),
        dtype=dtype,
        device=meta.device,
        requires_grad=meta.requires_grad,
        contiguous=_contiguous(meta.shape, meta.stride),
        low=low,
        high=high,
    )


def meta_inputs_code(metas) -> str:
    """The body of `make_inputs()` for inputs made from metadata."""
    lines = []
    for i, meta in enumerate(metas):
        if meta.kind is InputKind.TENSOR:
            lines.append(_tensor_code(meta))
        elif meta.kind in (InputKind.INT, InputKind.FLOAT, InputKind.BOOL, InputKind.SYMINT):
            lines.append(f"{meta.value!r},")
        elif meta.kind is InputKind.NONE:
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
            meta.kind is InputKind.TENSOR
            and meta.min_value is None
            and source is not None
            and source.kind is InputKind.TENSOR
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
    tensors = [i for i, m in enumerate(metas) if m.kind is InputKind.TENSOR]
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
