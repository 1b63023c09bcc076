"""The final Thunder traces of a thunder split and the fusion regions in them (nvFusionN, TorchCompileN, ...)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from thunderfx_debug.records import InputKind, InputMeta, Phase
from thunderfx_debug.thunder.instrument import without_marks


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

    @property
    def key(self) -> str:
        """"nvFusion0_forward": the region's name within its split (names repeat across phases)."""
        return f"{self.name}_{self.phase.value}"


def final_traces(compiled: Callable) -> tuple[Any | None, Any | None]:
    """The final forward and backward traces Thunder built for the last run of a thunder split (None before it ran),
    as Thunder built them: without the calls fusion timing inserts."""
    import thunder

    try:
        forward = thunder.last_traces(compiled)
    except TypeError:  # Thunder's way of saying "not called yet"
        return None, None
    try:
        backward = thunder.last_backward_traces(compiled)
    except TypeError:
        backward = None
    return without_marks(forward[-1] if forward else None), without_marks(backward[-1] if backward else None)


def _proxy_meta(proxy: Any) -> InputMeta:
    from thunder.core.dtypes import to_torch_dtype
    from thunder.core.proxies import TensorProxy

    if isinstance(proxy, TensorProxy):
        from torch._prims_common import make_contiguous_strides_for

        shape = tuple(int(s) for s in proxy.shape)
        return InputMeta(
            kind=InputKind.TENSOR,
            shape=shape,
            stride=tuple(make_contiguous_strides_for(shape)),  # proxies carry no strides; fusion inputs are contiguous
            dtype=str(to_torch_dtype(proxy.dtype)),
            device=str(proxy.device.device_str()) if hasattr(proxy.device, "device_str") else str(proxy.device),
            requires_grad=bool(getattr(proxy, "requires_grad", False)),
        )
    from thunder.core.proxies import NumberProxy

    if isinstance(proxy, NumberProxy):
        # Thunder knows some numbers only at run time (the philox seed and offset of nvFuser's dropout are
        # IntegerProxy(value=None)): the kind is kept, the value is what the region's captured call saw.
        python_type = getattr(proxy, "python_type", type(proxy.value))
        kind = {bool: InputKind.BOOL, int: InputKind.INT, float: InputKind.FLOAT}.get(python_type, InputKind.OTHER)
        return InputMeta(kind=kind, value=proxy.value if kind is not InputKind.OTHER else repr(proxy)[:200])
    if isinstance(proxy, bool | int | float):
        return InputMeta(kind=InputKind(type(proxy).__name__), value=proxy)
    return InputMeta(kind=InputKind.OTHER, value=repr(proxy)[:200])


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
