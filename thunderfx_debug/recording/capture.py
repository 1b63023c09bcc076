"""The real inputs and outputs of a first call, kept for repro scripts (THUNDERFX_DEBUG_INPUTS=real).

Capture happens once per graph and per split, on its first call. It copies each tensor's storage span to the host
without waiting for the device (`non_blocking` into pinned memory on CUDA; copies on the same stream are ordered
before any later in-place update, e.g. the optimizer's); the copies are read at flush, after the recorder waited for
the device. Beyond THUNDERFX_DEBUG_INPUTS_MAX_MB (counted per graph and per split, inputs and outputs together)
nothing is kept and the scripts fall back to metadata, saying so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import storage_span
from thunderfx_debug.safety import ReportingFailures


@dataclasses.dataclass
class Captured:
    """The values of a piece's first call: host copies (see `_host_copy`) or Python scalars. `skipped` says why
    nothing was kept (over the cap, an input of a kind that cannot be saved), and then `inputs` is None."""

    inputs: list[Any] | None = None
    outputs: list[Any] | None = None
    nbytes: int = 0
    max_mb: float = 0.0
    skipped: str | None = None


def _host_copy(t: torch.Tensor) -> dict[str, Any]:
    """The storage span of `t` copied to the host, with what rebuilds the tensor (any strides, expanded ones too)."""
    flat = t.detach().as_strided((storage_span(t.shape, t.stride()),), (1,), t.storage_offset())
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


def _copy_values(values: Iterable[Any], budget: int) -> tuple[list[Any] | None, int, str | None]:
    """Host copies of tensors and scalars; (None, bytes, reason) when they are over `budget` bytes or unsupported."""
    flat = list(values)
    total = 0
    for value in flat:
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided or type(value) not in (torch.Tensor, torch.nn.Parameter):
                return None, total, f"an input of type {type(value).__name__} ({value.layout}) cannot be saved"
            total += storage_span(value.shape, value.stride()) * value.element_size()
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


def _capture(args: Iterable[Any], max_mb: float) -> Captured:
    copies, nbytes, skipped = _copy_values(args, int(max_mb * 2**20))
    return Captured(inputs=copies, nbytes=nbytes, max_mb=max_mb, skipped=skipped)


def _add_outputs(captured: Captured | None, outputs: Any) -> None:
    if captured is None or captured.inputs is None:
        return
    budget = int(captured.max_mb * 2**20) - captured.nbytes
    copies, nbytes, _ = _copy_values(tree_leaves(outputs), budget)
    captured.outputs = copies
    if copies is not None:
        captured.nbytes += nbytes


class InputCapture:
    """Keeps host copies of the first call's inputs and outputs of a graph or split in its state's `real_inputs`,
    within `max_mb` each. A failure is logged (`failures`) and loses the copies of that piece only."""

    def __init__(self, max_mb: float, failures: ReportingFailures):
        self.max_mb, self.failures = max_mb, failures

    def inputs(self, state, args) -> None:
        """`state`: a `GraphState` or `SplitState` (anything with `name` and `real_inputs`)."""
        with self.failures.guard(f"capturing the real inputs of {state.name}"):
            state.real_inputs = _capture(args, self.max_mb)

    def outputs(self, state, outputs) -> None:
        with self.failures.guard(f"capturing the first outputs of {state.name}"):
            _add_outputs(state.real_inputs, outputs)
