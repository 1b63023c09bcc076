"""Script writers: a `ReproSubject` (what is reproduced: a Dynamo graph, a split, a fusion region) and a `Strategy`
per way of running it (eager, Thunder, torch.compile, inductor, nvFuser); `render` puts them into `templates.SCRIPT`.

Each strategy writes the code that builds its callable in the script (`build()`); checking and timing are the same
for all of them and live in `runtime`.
"""

from __future__ import annotations

import ast
import dataclasses
import posixpath
import textwrap
import types
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import templates
from thunderfx_debug.records import InputMeta
from thunderfx_debug.recording.capture import Captured

MODULE_CLASS = "DynamoModule"


@dataclasses.dataclass
class ReproSubject:
    """What a script reproduces: a Dynamo graph, a split or a fusion region.

    key: "graph0", "graph0/thunder_0" or "graph0/thunder_0/TorchCompile0_forward" (also the JSON `piece`).
    definitions: code that defines `callable_name` (an nn.Module class or a function) and what it needs.
    metas: the recorded inputs; captured: their real values where THUNDERFX_DEBUG_INPUTS=real kept them.
    inputs_path: where `captured` is saved in the dump (relative to the rank directory).
    """

    key: str
    title: str
    description: str
    definitions: str
    callable_name: str
    is_module: bool
    metas: tuple[InputMeta, ...]
    backward: bool
    captured: Captured | None = None
    inputs_path: str | None = None
    imports: tuple[str, ...] = ()
    inputs_note: str = ""

    @property
    def real(self) -> bool:
        return self.captured is not None and self.captured.inputs is not None and self.inputs_path is not None

    def instance(self) -> str:
        return f"{self.callable_name}()" if self.is_module else self.callable_name


class Strategy:
    """A way of running a piece. `executor` names it in the JSON figures; `file_kind` in the file name."""

    executor = "eager"
    file_kind = "eager"
    description = "eager PyTorch"

    def build_body(self, piece: ReproSubject) -> str:
        return f"return {piece.instance()}"

    def imports(self, piece: ReproSubject) -> list[str]:
        return []

    def definitions(self, piece: ReproSubject) -> str:
        return ""


class Eager(Strategy):
    pass


def _options_code(thunder_options: dict[str, Any], executor_names: list[str] | None) -> str:
    """`options = {...}` for the run's Thunder options: executors by name (resolved by Thunder in the script),
    literal values as they were; anything else (transform objects, callables) cannot be written and is listed."""
    literal, skipped = {}, []
    for key, value in thunder_options.items():
        if key == "executors":
            continue
        try:
            if ast.literal_eval(repr(value)) == value:
                literal[key] = value
                continue
        except (ValueError, SyntaxError, TypeError):
            pass
        skipped.append(f"{key}={value!r}"[:300])
    lines = [f"options = {literal!r}"]
    if executor_names is not None:
        lines.append(f"options['executors'] = runtime.executors({executor_names!r})")
    for text in skipped:
        lines.insert(0, f"# The run also had {text}: not writable as code; add it by hand to reproduce it exactly.")
    return "\n".join(lines)


class _WithThunderOptions(Strategy):
    """A strategy that runs the piece with Thunder, with the run's options and executors."""

    executor = "thunder"
    file_kind = "thunder"

    def __init__(self, thunder_options: dict[str, Any], executor_names: list[str] | None):
        self.options_code = _options_code(thunder_options, executor_names)


class ThunderFX(_WithThunderOptions):
    """A Dynamo graph through torch.compile with Thunder's own backend, as the run compiled it (same options)."""

    description = "ThunderFX: torch.compile(backend=thunder.dynamo.ThunderCompiler(<the run's options>))"

    def build_body(self, piece: ReproSubject) -> str:
        return (
            f"{self.options_code}\n"
            f"return torch.compile({piece.instance()}, backend=runtime.thunder_compiler(**options))"
        )


class ThunderJit(_WithThunderOptions):
    """A split through thunder.jit with the run's options and executors (Thunder 0.2.6's own writer drops them)."""

    description = "thunder.jit with the run's options and executors"

    def build_body(self, piece: ReproSubject) -> str:
        return f"import thunder\n\n{self.options_code}\nreturn thunder.jit({piece.instance()}, **options)"


class TorchCompile(Strategy):
    executor = "torchcompile"
    file_kind = "torchcompile"
    description = "torch.compile (inductor)"

    def build_body(self, piece: ReproSubject) -> str:
        return f"return torch.compile({piece.instance()})"


class InductorSplit(Strategy):
    """What ThunderFX does with an inductor split: `torch._inductor.compile` of the FX module with example inputs.
    The module is traced with torch.fx rather than handed to torch.compile, so Dynamo cannot split it again
    (lightning-thunder#1521, the same choice as Thunder's own report module)."""

    executor = "inductor"
    file_kind = "inductor"
    description = "torch._inductor.compile of the FX module (as ThunderFX compiles inductor splits)"

    def build_body(self, piece: ReproSubject) -> str:
        return (
            f"graph_module = torch.fx.symbolic_trace({piece.instance()})\n"
            "return torch._inductor.compile(graph_module, runtime.fresh(make_inputs()))"
        )


class InductorRegion(Strategy):
    """A fusion region's ops as a torch function compiled with torch.compile, as Thunder's torch.compile executor
    compiles a TorchCompileN region (`thunder.executors.torch_compile.make_compiled`: fullgraph, no autograd)."""

    executor = "inductor"
    file_kind = "inductor"
    description = "torch.compile(fullgraph=True) of the region's ops as a torch function"

    def build_body(self, piece: ReproSubject) -> str:
        return f"return torch.no_grad()(torch.compile({piece.callable_name}, fullgraph=True))"


class NvFuserRegion(Strategy):
    """nvFuser's own repro of the fusion definition the run used (`FusionDefinition.repro_script_for`)."""

    executor = "nvfuser"
    file_kind = "nvfuser"
    description = "nvFuser, with the fusion definition the run used (nvFuser's own repro of it)"

    def __init__(self, fusion_definition_code: str):
        self.code = fusion_definition_code

    def definitions(self, piece: ReproSubject) -> str:
        return "# nvFuser's repro of the fusion definition (FusionDefinition.repro_script_for):\n" + self.code.strip()

    def build_body(self, piece: ReproSubject) -> str:
        return "return lambda *inputs: fd.execute(list(inputs))"


# ---- writing Python for objects that Thunder's generated code refers to ------------------------------------------


def context_assignments(source: str, ctx: dict[str, Any], torch_executor_ops: frozenset[str]) -> list[str]:
    """Lines that bind the names a Thunder-generated function uses (its `python_ctx`) in a standalone script.

    Raises:
        ValueError: a name is bound to an object that has no written form.
    """
    lines = []
    for name, value in ctx.items():
        if isinstance(value, types.ModuleType):
            if f"import {value.__name__}" not in source:
                lines.append(f"import {value.__name__}")
        elif name in torch_executor_ops:
            lines.append(f"{name} = runtime.torch_executor_fn({name!r})")
        elif isinstance(value, torch.dtype | torch.memory_format | torch.layout):
            lines.append(f"{name} = {value}")
        elif isinstance(value, torch.device):
            lines.append(f"{name} = torch.device({str(value)!r})")
        elif isinstance(value, bool | int | float | str | type(None)):
            lines.append(f"{name} = {value!r}")
        elif _importable(value):
            lines.append(f"import {value.__module__}")
            lines.append(f"{name} = {value.__module__}.{value.__qualname__}")
        else:
            raise ValueError(f"the generated code uses {name}={value!r}, which has no written form")
    return lines


def _importable(value: Any) -> bool:
    import importlib

    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return False
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return found is value


# ---- rendering ----------------------------------------------------------------------------------------------------


def _indent(code: str) -> str:
    return textwrap.indent(code, "    ")


def render(piece: ReproSubject, strategy: Strategy, script_path: str, versions: str) -> str:
    """The text of the script at `script_path` (relative to the rank directory) running `piece` with `strategy`."""
    file_name = posixpath.basename(script_path)
    if piece.real:
        relative = posixpath.relpath(piece.inputs_path, posixpath.dirname(script_path))
        inputs_code = templates.REAL_INPUTS.format(path=relative)
        expected = "SAVED_OUTPUTS"
        note = "the tensors the run saw (first call), loaded with torch.load(weights_only=True)."
    else:
        body = repro_inputs.meta_inputs_code(piece.metas)
        inputs_code = templates.META_INPUTS.format(body=_indent(body))
        expected = "None"
        note = "random, made from the recorded metadata (shape, strides, dtype, device, value range)."
        if piece.captured is not None and piece.captured.skipped:
            note += f" The real tensors were not saved: {piece.captured.skipped}."
    if piece.inputs_note:
        note += " " + piece.inputs_note
    saved_outputs = piece.real and piece.captured.outputs is not None
    if not saved_outputs and piece.real:
        note += " The run's outputs were not saved (the piece failed, or they were over the cap)."
    if isinstance(strategy, Eager):
        check = templates.CHECK_EAGER_REAL if saved_outputs else templates.CHECK_EAGER_META
    else:
        check = templates.CHECK_AGAINST_RUN if saved_outputs else templates.CHECK_AGAINST_EAGER
    definitions = piece.definitions.strip()
    extra = strategy.definitions(piece)
    if extra:
        definitions += "\n\n\n" + extra
    imports = list(dict.fromkeys([*piece.imports, *strategy.imports(piece)]))
    return templates.SCRIPT.format(
        title=f"{piece.key}: {piece.title}, run with {strategy.description}.",
        description=piece.description,
        file_name=file_name,
        check=check,
        backward_note=", backward" if piece.backward else "",
        inputs_note=textwrap.fill(note, 110, subsequent_indent="    "),
        versions=versions,
        imports="\n".join(imports),
        definitions=definitions,
        inputs_code=inputs_code,
        eager_body=_indent(f"return {piece.instance()}"),
        build_body=_indent(strategy.build_body(piece)),
        piece=piece.key,
        executor=strategy.executor,
        expected=expected,
        backward=piece.backward,
    )
