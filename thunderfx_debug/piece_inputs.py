"""The inputs of a recorded call made again at flush, so that a compiled piece runs on them the code the run ran.

Compiled code is chosen by checks on its inputs: Thunder's prologue checks each tensor's shape, dtype, device and
requires_grad, the numbers it specialised on, the grad mode and autocast, and which plain tensors share a storage;
the torch.compile executor's regions guard on strides and on nn.Parameter too. Inputs that differ in any of these
make the piece compile again, and what would be timed is then another compile of it. So the inputs are, in order:

- the run's own tensors where they are still alive and laid out as on the recorded call (weak references taken then,
  `recording.capture`): its parameters as they are (read only: a split's backward goes through `torch.autograd.grad`,
  which accumulates nothing into `.grad`), other tensors (buffers, a batch the loop still holds) as copies with the
  same layout, so that a piece that writes into an input writes into the copy;
- the rest as the run captured them (THUNDERFX_DEBUG_INPUTS=real), else rebuilt from the recorded metadata by the
  code the repro scripts run (layouts exactly, values drawn like the run's; integer and bool tensors, which index
  and mask, as the run passed them, `Captured.integers`);
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
from thunderfx_debug.records import InputKind, InputMeta, storage_span
from thunderfx_debug.recording.capture import Captured, value_meta

#: What a live tensor must still have of its recorded metadata to stand in for the recorded call's input.
_LAYOUT = ("shape", "stride", "storage_offset", "dtype", "device", "requires_grad", "parameter")


def call_inputs(captured: Captured | None, metas: Sequence[InputMeta],
                names: Sequence[str] = ()) -> tuple[list[Any], str]:
    """(inputs, where they came from) for a piece whose call was `captured` (None: not captured) and whose inputs
    are described by `metas`; see the module docstring. Where they came from: "real", "meta", or either with how
    many are the run's own ("meta, the run's tensors for 23 of 30 inputs").

    Raises:
        ValueError: an input can be neither taken from the run nor rebuilt (an object of a kind with no metadata).
    """
    live = _live_tensors(captured, metas)
    if captured is not None and captured.inputs is not None:
        values, kind = captured_values(captured), "real"
    else:
        unresolvable = [i for i, m in enumerate(metas) if m.kind is InputKind.OTHER and i not in live]
        if unresolvable:
            i = unresolvable[0]
            raise ValueError(f"input {i} ({metas[i].value}) cannot be rebuilt from its metadata")
        values, kind = rebuilt_inputs(metas, names), "meta"
        for i, saved in repro_inputs.run_integers(captured, metas).items():  # as the scripts take them
            values[i] = script_template._rebuild(saved)
    for i, tensor in live.items():
        values[i] = tensor if isinstance(tensor, torch.nn.Parameter) else script_template.fresh([tensor])[0]
    values = placed_as_in_the_run(values, metas, frozenset(i for i, t in live.items()
                                                           if isinstance(t, torch.nn.Parameter)))
    tensors = sum(m.kind is InputKind.TENSOR for m in metas)
    if live and len(live) == tensors and kind == "meta":
        return values, "the run's tensors"
    return values, kind if not live else f"{kind}, the run's tensors for {len(live)} of {tensors} inputs"


def captured_values(captured: Captured) -> list[Any]:
    """The inputs `captured` holds (THUNDERFX_DEBUG_INPUTS=real, or a mismatching call's), as the run had them, by
    the code a repro script loads its inputs file with (`script_template._rebuild`, which scripts carry as source)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the capture's non-blocking host copies are complete from here on
    return [script_template._rebuild(x) for x in captured.inputs]


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


def placed_as_in_the_run(values: Sequence[Any], metas: Sequence[InputMeta],
                         keep: frozenset[int] = frozenset()) -> list[Any]:
    """`values` sharing storages where the run's inputs did, parameters where the run passed parameters, and each
    tensor that requires grad a tensor of its own (see the module docstring). `keep`: inputs that are the run's own
    tensors, never written to nor replaced (an input sharing a storage with one of them becomes a view of it).

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
        _share_storage(values, metas, root, members, writable=root not in keep)
    grouped = {i for root, members in groups.items() for i in (root, *members)}
    for i, (value, meta) in enumerate(zip(values, metas)):
        if i in keep or not isinstance(value, torch.Tensor):
            continue
        if i not in grouped and value.requires_grad and value._base is not None:
            own = value.detach().clone(memory_format=torch.preserve_format)
            if own.stride() == value.stride():  # dense views keep their layout; others stay as they are
                values[i] = value = own.requires_grad_()
        if meta.parameter and not isinstance(value, torch.nn.Parameter):
            values[i] = torch.nn.Parameter(value, requires_grad=value.requires_grad)
    return values


def _share_storage(values: list[Any], metas: Sequence[InputMeta], root: int, members: list[int],
                   writable: bool) -> None:
    """Makes `members` views of one storage at their recorded offsets and strides: a new one holding each member's
    values and the root's last (where values were drawn, the root's are the ones the views share, as in the run), or
    with `writable` False the storage of `values[root]` itself, the run's own, left as it is."""
    base = values[root]
    needed = max(_reach_bytes(values[i], metas[i]) for i in (root, *members))
    if writable:
        storage = torch.empty(-(-needed // base.element_size()), dtype=base.dtype, device=base.device).untyped_storage()
        for i in (*members, root):
            span = storage_span(values[i].shape, values[i].stride())
            if span:
                source = values[i].detach().as_strided((span,), (1,), values[i].storage_offset())
                _view(storage, source.dtype, source.device, (span,), (1,), metas[i].storage_offset).copy_(source)
    else:
        storage = base.untyped_storage()
        if storage.nbytes() < needed:
            return  # the run's tensor no longer reaches where the views were: the members stay as they are
    for i in (root, *members) if writable else members:
        meta, value = metas[i], values[i]
        view = _view(storage, value.dtype, value.device, meta.shape, meta.stride, meta.storage_offset)
        values[i] = view.requires_grad_() if value.requires_grad else view


def _reach_bytes(value: torch.Tensor, meta: InputMeta) -> int:
    return (meta.storage_offset + storage_span(meta.shape, meta.stride)) * value.element_size()


def _view(storage, dtype, device, shape, stride, offset) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, tuple(shape), tuple(stride))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
