"""The inputs of a recorded call made again in a child process of the flush (`triage.child`, the minimizer),
so that a piece runs there on inputs like the run's.

Compiled code is chosen by checks on its inputs: Thunder's prologue checks each tensor's shape, dtype, device and
requires_grad, the numbers it specialised on, the grad mode and autocast, and which plain tensors share a storage;
the torch.compile executor's regions guard on strides and on nn.Parameter too. Inputs that differ in any of these
make the piece compile other code than the run's. So the inputs are, in order:

- in the training process (`run_tensors`), host copies of what the run really had: the recorded call's inputs where
  they were captured (THUNDERFX_DEBUG_INPUTS=real), else its integer and bool inputs as the recorded call passed them
  (they index, select and mask: `Captured.integers`, as the repro scripts take them) and the run's own tensors still
  alive and laid out as on that call (weak references taken then, `recording.capture`: its parameters, buffers, a
  batch the loop still holds);
- in the child (`made_inputs`), those copies on the run's devices, the rest rebuilt from the recorded metadata by
  the code the repro scripts run (layouts exactly, values drawn like the run's);
- then every input placed as the run placed it: inputs that shared a storage in the run share one again, each at its
  own offset and strides (`InputMeta.alias_of`), parameters are parameters, and an input that requires grad is a
  tensor of its own (inside a Thunder split a view of a storage made for it would reach the regions without
  requires_grad, and the torch.compile executor's regions guard on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.triage.jobs import PieceInputs, RunTensors
from thunderfx_debug.records import InputKind, InputMeta, storage_span
from thunderfx_debug.recording.capture import Captured, host_copy, value_meta

#: What a live tensor must still have of its recorded metadata to stand in for the recorded call's input.
_LAYOUT = ("shape", "stride", "storage_offset", "dtype", "device", "requires_grad", "parameter")


def run_tensors(captured: Captured | None, metas: Sequence[InputMeta]) -> RunTensors:
    """Host copies of a piece's inputs as the run had them (see the module docstring); reads the device, so the
    caller waits for it first (`captured`'s own copies are complete only then)."""
    if captured is not None and captured.inputs is not None:
        return RunTensors(captured=list(captured.inputs))
    taken = dict(repro_inputs.run_integers(captured, metas))
    taken.update({i: host_copy(t, blocking=True) for i, t in _live_tensors(captured, metas).items()})
    return RunTensors(live=taken)


def made_inputs(inputs: PieceInputs, tensors: RunTensors) -> tuple[list[Any], str]:
    """(inputs, where they came from) in the child: see the module docstring. Where they came from: "real", "meta",
    "the run's tensors" (all of them alive), or "meta, the run's tensors for 23 of 30 inputs".

    Raises:
        ValueError: an input can be neither taken from the run nor rebuilt (an object of a kind with no metadata).
    """
    metas, live = inputs.metas, tensors.live
    if tensors.captured is not None:
        values, kind = [script_template._rebuild(x) for x in tensors.captured], "real"
    else:
        unresolvable = [i for i, m in enumerate(metas) if m.kind is InputKind.OTHER and i not in live]
        if unresolvable:
            i = unresolvable[0]
            raise ValueError(f"input {i} ({metas[i].value}) cannot be rebuilt from its metadata")
        values, kind = rebuilt_inputs(metas, inputs.names), "meta"
    for i, copy in live.items():
        values[i] = script_template._rebuild(copy)
    values = placed_as_in_the_run(values, metas)
    tensors_in = sum(m.kind is InputKind.TENSOR for m in metas)
    if live and len(live) == tensors_in and kind == "meta":
        return values, "the run's tensors"
    return values, kind if not live else f"{kind}, the run's tensors for {len(live)} of {tensors_in} inputs"


def rebuilt_inputs(metas: Sequence[InputMeta], names: Sequence[str] = ()) -> list[Any]:
    """Inputs made from recorded metadata, by the code the repro scripts run (`repro.inputs.make_inputs_code` with
    `script_template.tensor`): the run's layouts, values drawn like the run's, from the scripts' seed (on a generator
    state of its own: the training's random streams are the caller's to keep)."""
    body = repro_inputs.make_inputs_code(metas, names)
    source = "def make_inputs():\n" + "".join(f"    {line}\n" for line in body.splitlines())
    namespace: dict[str, Any] = {"torch": torch, "tensor": script_template.tensor}
    exec(compile(source, "<triage inputs>", "exec"), namespace)  # noqa: S102  (our own generated code)
    torch.manual_seed(script_template.SEED)
    return namespace["make_inputs"]()


def _live_tensors(captured: Captured | None, metas: Sequence[InputMeta]) -> dict[int, torch.Tensor]:
    """input index -> the run's tensor passed there, where it is alive and laid out as on the recorded call."""
    live = {}
    for i, ref in (captured.references.items() if captured is not None else ()):
        tensor = ref()
        if tensor is None or i >= len(metas):
            continue
        now, then = value_meta(tensor), metas[i]
        if all(getattr(now, field) == getattr(then, field) for field in _LAYOUT):
            live[i] = tensor
    # Inputs that shared a storage must share it still (a buffer the run has since replaced shares no more).
    for i in list(live):
        root = metas[i].alias_of
        if root is not None and root in live and not _same_storage(live[i], live[root]):
            del live[i]
    return live


def placed_as_in_the_run(values: Sequence[Any], metas: Sequence[InputMeta]) -> list[Any]:
    """`values` sharing storages where the run's inputs did, parameters where the run passed parameters, and each
    tensor that requires grad a tensor of its own (see the module docstring).

    Example (the run passed position ids and an expanded view of them, as Hugging Face decoders do):
        >>> from thunderfx_debug.records import InputKind, InputMeta
        >>> ids = InputMeta(InputKind.TENSOR, shape=(1, 4), stride=(4, 1), dtype="torch.int64", storage_size=4)
        >>> expanded = InputMeta(InputKind.TENSOR, shape=(2, 4), stride=(0, 1), dtype="torch.int64", storage_size=4,
        ...                      alias_of=0)
        >>> a, b = placed_as_in_the_run([torch.arange(4)[None], torch.zeros(4, dtype=torch.int64).expand(2, 4)],
        ...                             [ids, expanded])
        >>> a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), b.stride(), b[1].tolist()
        (True, (0, 1), [0, 1, 2, 3])
    """
    values = list(values)
    groups: dict[int, list[int]] = {}
    for i, meta in enumerate(metas):
        if (meta.alias_of is not None and i < len(values) and meta.alias_of < len(values)
                and isinstance(values[i], torch.Tensor) and isinstance(values[meta.alias_of], torch.Tensor)):
            groups.setdefault(meta.alias_of, []).append(i)
    for root, members in groups.items():
        _share_storage(values, metas, root, members)
    grouped = {i for root, members in groups.items() for i in (root, *members)}
    for i, (value, meta) in enumerate(zip(values, metas)):
        if not isinstance(value, torch.Tensor):
            continue
        if i not in grouped and value.requires_grad and value._base is not None:
            own = value.detach().clone(memory_format=torch.preserve_format)
            if own.stride() == value.stride():  # dense views keep their layout; others stay as they are
                values[i] = value = own.requires_grad_()
        if meta.parameter and not isinstance(value, torch.nn.Parameter):
            values[i] = torch.nn.Parameter(value, requires_grad=value.requires_grad)
    return values


def _share_storage(values: list[Any], metas: Sequence[InputMeta], root: int, members: list[int]) -> None:
    """Makes the root and `members` views of one new storage at their recorded offsets and strides, holding each
    member's values and the root's last (where values were drawn, the root's are the ones the views share, as in the
    run)."""
    base = values[root]
    needed = max(_reach_bytes(values[i], metas[i]) for i in (root, *members))
    storage = torch.empty(-(-needed // base.element_size()), dtype=base.dtype, device=base.device).untyped_storage()
    for i in (*members, root):
        span = storage_span(values[i].shape, values[i].stride())
        if span:
            source = values[i].detach().as_strided((span,), (1,), values[i].storage_offset())
            _view(storage, source.dtype, source.device, (span,), (1,), metas[i].storage_offset).copy_(source)
    for i in (root, *members):
        meta, value = metas[i], values[i]
        view = _view(storage, value.dtype, value.device, meta.shape, meta.stride, meta.storage_offset)
        values[i] = view.requires_grad_() if value.requires_grad else view


def _reach_bytes(value: torch.Tensor, meta: InputMeta) -> int:
    return (meta.storage_offset + storage_span(meta.shape, meta.stride)) * value.element_size()


def _view(storage, dtype, device, shape, stride, offset) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, tuple(shape), tuple(stride))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
