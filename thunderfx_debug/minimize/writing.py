"""Trial and minimal scripts, written by the writers every repro script comes from (`artifacts.repro.writers`:
the same template, so the same check, verdict line and exit status), with the inputs of the cut saved next to
them as real values (`torch.save`, read back by the template's `load_inputs` with `weights_only=True`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import writers
from thunderfx_debug.minimize.statements import PieceCode
from thunderfx_debug.recording.capture import Captured, InputCapture, value_meta
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.splits import sequence_of_numbers

#: A cap no piece reaches: a trial's inputs are saved whole, however large (they are what the piece needs).
_UNCAPPED_MB = 1e9


@dataclasses.dataclass(frozen=True)
class PieceSpec:
    """What stays the same across the trials of one piece. `key` names it ("graph0/thunder_0",
    "graph0/thunder_0/nvFusion0_forward"); `stem` is the file name it gets ("graph0_thunder_0");
    `file_kind` the backend in the minimal script's name (thunder, inductor, nvfuser); `strategy` how trials
    build it; `prelude` the code its statements need (imports, the torch executor's helpers); `origin` where it
    came from (a script's name, or the run); `run_failure` what it raised in the run, where it raised."""

    key: str
    stem: str
    title: str
    file_kind: str
    strategy: writers.Strategy
    prelude: str
    backward: bool
    random_ops: tuple[str, ...] = ()
    needs_thunder: bool = False
    origin: str = ""
    executor: str = ""  # the fusion executor of a region ("nvfuser", "torchcompile"), "" for a split
    # what the piece raised in the run, which every trial expects (`script_template.main`'s `run_failure`); None for
    # a piece that did not raise
    run_failure: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Cut:
    """One candidate: the ops kept (indices into the piece's ops), the names it returns and takes."""

    kept: tuple[int, ...]
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]


class KeptBuild(writers.Strategy):
    """A script's own way of building its piece (the body of its `build()`, as written), for the trials of a
    script given to `thunderfx-debug minimize`: the cut piece keeps the name the body refers to."""

    def __init__(self, executor: str, file_kind: str, backend: str, description: str, body: str,
                 needs_thunder: bool):
        self.executor, self.file_kind, self.backend = executor, file_kind, backend
        self.description, self.body, self.needs_thunder = description, body, needs_thunder

    def build_body(self, piece: writers.ReproSubject) -> str:
        return self.body


class ThroughThunder(writers.ThunderJit):
    """A fusion region's torch ops handed back to Thunder with the region's own executor (`thunder.jit` with that
    executor alone; Thunder adds its torch executor for what the region's executor does not claim)."""

    def __init__(self, executor: str):
        super().__init__({}, [executor])
        self.description = f"thunder.jit with the region's executor ({executor}), its ops handed back to Thunder"


def saved_inputs(values: Sequence[Any]) -> Captured:
    """`values` as an inputs file holds them (host copies with their layouts), or ValueError where one cannot be
    saved (a tuple, an object)."""
    holder = _Holder()
    InputCapture(real=True, max_mb=_UNCAPPED_MB, failures=ReportingFailures(strict=True),
                 statistics=False).inputs(holder, list(values))
    if holder.captured is None or holder.captured.inputs is None:
        raise ValueError(holder.captured.skipped if holder.captured is not None else "nothing captured")
    return holder.captured


class _Holder:
    name = "a minimized piece"
    captured: Captured | None = None


def savable(value: Any) -> bool:
    """Whether a value can be an input of a written script (see `saved_inputs`)."""
    if isinstance(value, torch.Tensor):
        return value.layout is torch.strided and type(value) in (torch.Tensor, torch.nn.Parameter)
    return (isinstance(value, bool | int | float | complex | type(None) | torch.dtype | torch.device)
            or sequence_of_numbers(value) is not None)


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)} on {value.device}"
    return repr(value)[:80]


def write(spec: PieceSpec, code: PieceCode, cut: Cut, values: Mapping[str, Any], folder: Path, name: str,
          description: str, versions: str, strategy: writers.Strategy | None = None,
          title: str | None = None) -> tuple[Path, Path]:
    """Writes `folder/<name>.py` running the cut piece and `folder/<name>_inputs.pt` holding its inputs; returns
    both paths. `values` maps every name the cut takes to its value."""
    script, inputs_file = folder / f"{name}.py", folder / f"{name}_inputs.pt"
    text, content = render(spec, code, cut, values, script.name, inputs_file.name, description, versions, strategy,
                           title)
    inputs_file.write_bytes(content)
    script.write_text(text)
    return script, inputs_file


def render(spec: PieceSpec, code: PieceCode, cut: Cut, values: Mapping[str, Any], script_name: str,
           inputs_name: str, description: str, versions: str, strategy: writers.Strategy | None = None,
           title: str | None = None) -> tuple[str, bytes]:
    """(the script's text, the inputs file's bytes) of the cut piece; see `write`."""
    arguments = [values[name] for name in cut.inputs]
    notes = {name: f"in the full piece, the value of `{code.ops[code.defined_at()[name]].label}` "
                   f"({describe_value(values[name])})"
             for name in cut.inputs if name not in code.params}
    captured = saved_inputs(arguments)
    definitions = code.render(cut.kept, cut.outputs, cut.inputs, notes)
    piece = writers.ReproSubject(
        key=spec.key,
        title=title or spec.title,
        description=description,
        definitions=(spec.prelude.strip() + "\n\n\n" if spec.prelude.strip() else "") + definitions,
        callable_name=code.name,
        is_module=code.kind == "module",
        metas=tuple(value_meta(v) for v in arguments),
        backward=spec.backward,
        names=tuple(cut.inputs),
        captured=captured,
        inputs_path=inputs_name,
        random_ops=spec.random_ops,
        needs_thunder=spec.needs_thunder,
        run_failure=spec.run_failure,
    )
    text = writers.render(piece, strategy or spec.strategy, script_name, versions)
    return text, repro_inputs.saved_file(captured)
