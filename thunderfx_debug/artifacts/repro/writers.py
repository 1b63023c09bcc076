"""Script writers: a `ReproSubject` (what is reproduced: a Dynamo graph, a split or a fusion region) and a `Strategy`
per way of running it (eager, Thunder, torch.compile, inductor, nvFuser); `render` writes them into a script.

A script is made of: a docstring that says what it reproduces, how to run it and what its exit status means; the
source of `script_template` (the check, the inputs, the timing, `main`: the same in every script), with the text of
each module of `thunderfx_debug/scripts/` it imports in place of the import (`inlined_source`), and, where the
strategy runs Thunder, of `thunder.script_support` (the workarounds the installed versions need); then the piece:
its code, `make_inputs()`, `eager()`, `build()` and the call of `main`. Nothing of thunderfx_debug is imported, so a
script runs where the package is not installed and can be attached to an upstream bug report as it is.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import inspect
import posixpath
import textwrap
import types
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.records import READS_SAVED, InputMeta
from thunderfx_debug.recording.capture import Captured
from thunderfx_debug.recording.manifest import package_versions
from thunderfx_debug.thunder import script_support

MODULE_CLASS = "DynamoModule"

EXIT_STATUS = (
    "Exit status, with one line saying which:\n"
    "    0 OK              the piece matches within the tolerance\n"
    "    1 MISMATCH        its result differs beyond the tolerance, or values it returned changed afterwards: a\n"
    "                      finding about {backend}, worth reporting upstream with this script\n"
    "    3 REFUSED         the backend or eager refused the inputs this script built: a bug of thunderfx_debug's\n"
    "                      input rebuild, not of {backend}\n"
    "    4 CRASH           {backend} raised on inputs that eager accepts (or failed to compile the piece)\n"
    "    5 NOT COMPARABLE  the piece draws random numbers that {backend} and eager draw differently, or its\n"
    "                      values follow which of tied values topk/sort/argmax picked, and {backend} picked\n"
    "                      otherwise: no claim\n"
    "    6 NOT REBUILT     this script could not rebuild the piece as the run built it ({backend} never ran it:\n"
    "                      a bug of the script, or an executor of the run's that is not registered here): no claim\n"
    "    7 REPRODUCED      the piece failed in the run and raised the same here: the run's failure, reproduced\n"
    "    8 NOT REPRODUCED  the piece failed in the run and does not fail so here (the line says what the run had\n"
    "                      that this script has not): no claim that it works\n"
    "    (killed by a signal: a native abort, e.g. an inductor kernel's bounds assertion: a crash)"
)


@dataclasses.dataclass
class ReproSubject:
    """What a script reproduces: a Dynamo graph, a split or a fusion region.

    key: "graph0", "graph0/thunder_0" or "graph0/thunder_0/TorchCompile0_forward" (also the JSON `piece`).
    definitions: code that defines `callable_name` (an nn.Module class or a function) and what it needs.
    metas: the inputs as the run passed them; names: their names (comments in `make_inputs`).
    captured: the real values where THUNDERFX_DEBUG_INPUTS=real kept them; inputs_path: where they are saved in the
    dump (relative to the rank directory). run_integers: without real values, the integer and bool inputs the run
    passed (position -> host copy, `inputs.run_integers`), saved at inputs_path; the others are drawn.
    random_ops: the names of the random ops in the piece.
    needs_thunder: the definitions call `import_thunder()` or other Thunder support.
    sources: the lines of the model's code its ops came from ("file:line function", most ops first).
    reads_saved_from: a backward region's: the lines of the forward ops that made the saved values it reads.
    run_failure: what the piece raised in the run (`script_template.main`'s `run_failure`), for the scripts of the
    backend that raised it, which expect it (None for the others).
    """

    key: str
    title: str
    description: str
    definitions: str
    callable_name: str
    is_module: bool
    metas: tuple[InputMeta, ...]
    backward: bool
    names: tuple[str, ...] = ()
    captured: Captured | None = None
    inputs_path: str | None = None
    run_integers: dict[int, dict] = dataclasses.field(default_factory=dict)
    imports: tuple[str, ...] = ()
    inputs_note: str = ""
    random_ops: tuple[str, ...] = ()
    draws: str | None = None  # how the Thunder split drew its dropouts, where its script draws them so (`DRAWS`)
    needs_thunder: bool = False
    sources: tuple[str, ...] = ()
    reads_saved_from: tuple[str, ...] = ()
    run_failure: dict[str, Any] | None = None
    inputs_call: int = 1  # the piece's call whose inputs the script has (the one that raised, for a failing piece)

    @property
    def which_call(self) -> str:
        """"first call", or "call 3" where the inputs are those of a later call."""
        return "first call" if self.inputs_call == 1 else f"call {self.inputs_call}"

    @property
    def real(self) -> bool:
        return self.captured is not None and self.captured.inputs is not None and self.inputs_path is not None

    @property
    def takes_run_integers(self) -> bool:
        """Whether its script draws its inputs but for the integer and bool ones, loaded from `inputs_path`."""
        return not self.real and bool(self.run_integers) and self.inputs_path is not None

    def instance(self) -> str:
        return f"{self.callable_name}()" if self.is_module else self.callable_name


class Strategy:
    """A way of running a piece. `executor` names it in the JSON figures, `file_kind` in the file name, `backend`
    in the verdict line; `needs_thunder` scripts carry `thunder.script_support`."""

    executor = "eager"
    file_kind = "eager"
    backend = "eager PyTorch"
    description = "eager PyTorch"
    needs_thunder = False

    def build_body(self, piece: ReproSubject) -> str:
        return f"return {piece.instance()}"

    def definitions(self, piece: ReproSubject) -> str:
        return ""

    def refusal(self, piece: ReproSubject) -> str:
        return "None"

    def metas(self, piece: ReproSubject) -> tuple[InputMeta, ...]:
        return piece.metas

    def loaded_inputs(self, piece: ReproSubject, expression: str) -> str:
        """The expression of the inputs a real-input script loads (`expression`), as this strategy takes them."""
        return expression

    def inputs_note(self, piece: ReproSubject) -> str:
        """What the script's docstring adds about this strategy's inputs."""
        return ""


class Eager(Strategy):
    pass


def _options_code(thunder_options: dict[str, Any], executor_names: list[str] | None,
                  executor_modules: dict[str, tuple[str | None, str | None]] | None = None) -> str:
    """`options = {...}` for the run's Thunder options: executors by name (resolved by Thunder in the script, after
    importing the modules that registered the run's own executors, `executor_modules`), literal values as they
    were; anything else (transform objects, callables) cannot be written and is listed."""
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
        modules = {name: where for name, where in (executor_modules or {}).items() if name in executor_names}
        lines.append(f"options['executors'] = executors({executor_names!r}" + (f", {modules!r})" if modules else ")"))
    for text in skipped:
        lines.insert(0, f"# The run also had {text}: not writable as code; add it by hand to reproduce it exactly.")
    return "\n".join(lines)


def executors_note(executor_names: list[str] | None,
                   executor_modules: dict[str, tuple[str | None, str | None]] | None) -> str:
    """What a script's docstring says of the run's executors of the user's: the module it imports for each, or
    why it cannot (the script then says which executor is missing, NOT REBUILT)."""
    notes = []
    for name, (module, where) in (executor_modules or {}).items():
        if executor_names is not None and name not in executor_names:
            continue
        if module is not None:
            notes.append(f"the run's executor {name!r} is registered by importing {module} (from {where}, where the "
                         "run imported it), which build() does")
        else:
            notes.append(f"the run's executor {name!r} cannot be imported here: {where}; register it before build() "
                         "(this script says NOT REBUILT, naming it, where it is missing)")
    return "Executors: " + "; ".join(notes) + "." if notes else ""


class _WithThunderOptions(Strategy):
    """A strategy that runs the piece with Thunder, with the run's options and executors."""

    executor = "thunder"
    file_kind = "thunder"
    backend = "Thunder"
    needs_thunder = True

    def __init__(self, thunder_options: dict[str, Any], executor_names: list[str] | None,
                 executor_modules: dict[str, tuple[str | None, str | None]] | None = None):
        self.options_code = _options_code(thunder_options, executor_names, executor_modules)
        self.executors_note = executors_note(executor_names, executor_modules)


class ThunderFX(_WithThunderOptions):
    """A Dynamo graph through torch.compile with Thunder's own backend, compiling as the run did (same options,
    same workarounds: `script_support.thunder_compiler`; dynamic shapes where the run's graph had them)."""

    description = "ThunderFX: torch.compile(backend=thunder.dynamo.ThunderCompiler(<the run's options>))"

    def __init__(self, thunder_options: dict[str, Any], executor_names: list[str] | None,
                 executor_modules: dict[str, tuple[str | None, str | None]] | None = None, dynamic: bool = False):
        super().__init__(thunder_options, executor_names, executor_modules)
        self.dynamic = dynamic

    def build_body(self, piece: ReproSubject) -> str:
        dynamic = ", dynamic=True" if self.dynamic else ""
        return (f"{self.options_code}\n"
                f"return torch.compile({piece.instance()}, backend=thunder_compiler(**options){dynamic})")


class ThunderJit(_WithThunderOptions):
    """A split through thunder.jit with the run's options and executors (Thunder 0.2.6's own writer drops them)
    and, for a split (`as_split`), which of its outputs are differentiable, computed as ThunderFX's splitter computes
    it (`script_template.differentiable_outputs_as_thunderfx`)."""

    description = "thunder.jit with the run's options and executors"

    def __init__(self, thunder_options: dict[str, Any], executor_names: list[str] | None,
                 executor_modules: dict[str, tuple[str | None, str | None]] | None = None, as_split: bool = False):
        super().__init__(thunder_options, executor_names, executor_modules)
        self.as_split = as_split
        if as_split:
            self.description = ("thunder.jit with the run's options and executors, as ThunderFX jits a split (which "
                                "outputs are differentiable)")

    def build_body(self, piece: ReproSubject) -> str:
        outputs = ""
        if self.as_split:
            outputs = ("# ThunderFX's splitter also tells thunder.jit which outputs are differentiable:\n"
                       "options['is_differentiable_outputs'] = differentiable_outputs_as_thunderfx("
                       f"{piece.instance()}, make_inputs())\n")
        return (f"thunder = import_thunder()\n{self.options_code}\n{outputs}"
                f"return thunder.jit({piece.instance()}, **options)")


class TorchCompile(Strategy):
    executor = "torchcompile"
    file_kind = "torchcompile"
    backend = "torch.compile (inductor)"
    description = "torch.compile (inductor)"

    def build_body(self, piece: ReproSubject) -> str:
        return f"return torch.compile({piece.instance()})"


class InductorSplit(Strategy):
    """What ThunderFX does with an inductor split: `torch._inductor.compile` of the FX module with example inputs.
    The module is traced with torch.fx rather than handed to torch.compile, so Dynamo cannot split it again
    (lightning-thunder#1521, the same choice as Thunder's own report module), by the template's
    `dynamo_graph_module`, which keeps Dynamo's item assignments and in-place operators (a plain
    `torch.fx.symbolic_trace` refuses `x[i] = v`); a failure of that trace is the script's own (NOT REBUILT)."""

    executor = "inductor"
    file_kind = "inductor"
    backend = "inductor"
    description = "torch._inductor.compile of the FX module (as ThunderFX compiles inductor splits)"

    def build_body(self, piece: ReproSubject) -> str:
        return (f"graph_module = as_the_run_built(lambda: for_inductor(dynamo_graph_module({piece.instance()})), "
                "\"tracing the split's code for inductor\")\n"
                "return torch._inductor.compile(graph_module, fresh(make_inputs()))")


class InductorRegion(Strategy):
    """A fusion region's ops as a torch function compiled with torch.compile, as Thunder's torch.compile executor
    compiles a TorchCompileN region (`thunder.executors.torch_compile.make_compiled`: fullgraph, no autograd)."""

    executor = "inductor"
    file_kind = "inductor"
    backend = "inductor"
    description = "torch.compile(fullgraph=True) of the region's ops as a torch function"

    def build_body(self, piece: ReproSubject) -> str:
        return f"return torch.no_grad()(torch.compile({piece.callable_name}, fullgraph=True))"


class NvFuserRegion(Strategy):
    """nvFuser's own repro of the fusion definition the run used (`FusionDefinition.repro_script_for`), executed
    with the inputs laid out as that definition binds them (`inputs.in_nvfuser_layouts`; saved inputs copied into
    that layout, `script_template.nvfuser_layouts`); before that, the inputs are checked against what the
    definition declares (`nvfuser_refusal`)."""

    executor = "nvfuser"
    file_kind = "nvfuser"
    backend = "nvFuser"
    description = "nvFuser, with the fusion definition the run used (nvFuser's own repro of it)"

    def __init__(self, fusion_definition_code: str):
        self.code = fusion_definition_code
        self.declared = repro_inputs.nvfuser_declared_inputs(fusion_definition_code)

    def _declared(self, piece: ReproSubject) -> list[dict] | None:
        """The definition's inputs where they match the region's, one for one (else nothing is checked)."""
        return self.declared if self.declared is not None and len(self.declared) == len(piece.metas) else None

    def definitions(self, piece: ReproSubject) -> str:
        body = textwrap.indent(self.code.strip(), "    ")
        declared = "None" if self._declared(piece) is None else _literal_list(self._declared(piece))
        return (
            "def define_fusion():\n"
            "    # nvFuser's repro of the fusion definition the run used (FusionDefinition.repro_script_for; a\n"
            "    # constant that an op takes as a Val, such as topk's k, defined as one, and float constants written\n"
            "    # in full, as the printer should):\n"
            f"{body}\n"
            "    return fd\n\n\n"
            "# The definition's inputs as it declares them, to check the inputs against before nvFuser binds them.\n"
            f"NVFUSER_INPUTS = {declared}"
        )

    def build_body(self, piece: ReproSubject) -> str:
        return ("fd = as_the_run_built(define_fusion, \"nvFuser's printed definition\")\n"
                "return lambda *inputs: fd.execute(list(inputs))")

    def refusal(self, piece: ReproSubject) -> str:
        return "None" if self._declared(piece) is None else "lambda inputs: nvfuser_refusal(inputs, NVFUSER_INPUTS)"

    def _layouts(self, piece: ReproSubject) -> tuple[tuple[InputMeta, ...], list[int]]:
        declared = self._declared(piece)
        return (piece.metas, []) if declared is None else repro_inputs.in_nvfuser_layouts(piece.metas, declared)

    def metas(self, piece: ReproSubject) -> tuple[InputMeta, ...]:
        return self._layouts(piece)[0]

    def loaded_inputs(self, piece: ReproSubject, expression: str) -> str:
        return expression if self._declared(piece) is None else f"nvfuser_layouts({expression}, NVFUSER_INPUTS)"

    def inputs_note(self, piece: ReproSubject) -> str:
        relaid = self._layouts(piece)[1]
        if not relaid or piece.real:
            return ""
        names = ", ".join(piece.names[i] if i < len(piece.names) else f"input {i}" for i in relaid)
        return (f"{names}: laid out as nvFuser's definition declares; the run's first call, which was captured, "
                "had other strides (the definition is nvFuser's for a later call of the region).")


def _literal_list(items: list[Any]) -> str:
    return "[\n" + "".join(f"    {item!r},\n" for item in items) + "]"


# ---- writing Python for objects that Thunder's generated code refers to ------------------------------------------


def context_assignments(source: str, ctx: dict[str, Any], helpers: dict[str, str | None]) -> tuple[list[str], bool]:
    """Lines that bind the names a Thunder-generated function uses (its `python_ctx`) in a standalone script, and
    whether they need Thunder at run time. `helpers` maps the names of Thunder's torch-executor helpers among them
    to their standalone code (None: looked up from Thunder by name in the script).

    Raises:
        ValueError: a name is bound to an object that has no written form.
    """
    lines, needs_thunder = [], False
    for name, value in ctx.items():
        if isinstance(value, types.ModuleType):
            if f"import {value.__name__}" not in source:
                lines.append(f"import {value.__name__}")
        elif name in helpers:
            if helpers[name] is None:
                lines.append(f"{name} = torch_executor_fn({name!r})")
                needs_thunder = True
            else:
                lines.append(helpers[name])
        elif (getattr(value, "__module__", None) or "").startswith(f"{CARRIED}."):
            # the package's bottom layer (nvFuser's draws): every script carries what the template imports of it
            if getattr(script_template, getattr(value, "__name__", ""), None) is not value:
                raise ValueError(f"the generated code uses {name}={value!r}, which the script template does not carry")
            if name != value.__name__:
                lines.append(f"{name} = {value.__name__}")
        elif isinstance(value, torch.dtype | torch.memory_format | torch.layout):
            lines.append(f"{name} = {value}")
        elif isinstance(value, torch.device):
            lines.append(f"{name} = torch.device({str(value)!r})")
        elif isinstance(value, bool | int | float | str | type(None)):
            lines.append(f"{name} = {value!r}")
        elif _importable(value):
            if value.__module__.split(".")[0] == "thunder":
                needs_thunder = True
                lines.append(f"import_thunder()\nimport {value.__module__}")
            else:
                lines.append(f"import {value.__module__}")
            lines.append(f"{name} = {value.__module__}.{value.__qualname__}")
        else:
            raise ValueError(f"the generated code uses {name}={value!r}, which has no written form")
    return lines, needs_thunder


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


@functools.cache
def _module_body(module: types.ModuleType) -> str:
    """A module's source without its docstring (the script's own docstring says what the template does)."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    first = tree.body[0]
    lines = source.splitlines()
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        lines = lines[first.end_lineno:]
    return "\n".join(lines).strip() + "\n"


#: What a script's header says of each way a run's dropouts are drawn again (`scripts.philox_draws.DRAWS`).
DRAWS_SAID = {
    "nvfuser": "nvFuser's Philox draws of uniform_philox, by nvfuser_uniform",
    "torch_uniform": "torch's uniform_ from the generator, as Thunder's torch executor draws dropout's uniform",
    "eager": "by an executor's own dropout op, taken to draw as torch's F.dropout does from the same generator state",
}


#: The package's bottom layer: what every script carries, inlined where `script_template` imports from it.
CARRIED = "thunderfx_debug.scripts"


@functools.cache
def inlined_source(template: types.ModuleType) -> str:
    """`template`'s source (`script_template`'s, for every script) as a script carries it: without its docstring
    (the script's own says what the template does), and each `from thunderfx_debug.scripts.<module> import ...` at
    its top level replaced by the text of that module (`_inlined`; a module imported twice is inlined once), so that
    the script needs nothing of thunderfx_debug. Any other import of the package is a ValueError: a script could not
    run it."""
    source = inspect.getsource(template)
    where = posixpath.basename(template.__file__)
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    replaced: dict[int, tuple[int, str]] = {}  # first line (0-based) -> (line after the import, its replacement)
    inlined: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        relative = getattr(node, "level", 0) > 0
        if not relative and not any(m.partition(".")[0] == "thunderfx_debug" for m in modules):
            continue
        carried = (isinstance(node, ast.ImportFrom) and not relative and id(node) in top_level
                   and (node.module or "").startswith(f"{CARRIED}."))
        if not carried or any(alias.asname for alias in node.names):
            raise ValueError(f"{where}:{node.lineno} imports {modules[0] or 'from its package'}: a script can carry "
                             f"only `from {CARRIED}.<module> import name` at the template's top level")
        module = importlib.import_module(node.module)
        replaced[node.lineno - 1] = (node.end_lineno, "" if node.module in inlined else _inlined(module))
        inlined.add(node.module)
    lines = source.splitlines()
    first = tree.body[0]
    i = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else 0
    out = []
    while i < len(lines):
        if i in replaced:
            i, text = replaced[i]
            out.append(text.rstrip("\n") + "\n" if text else "")
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out).strip() + "\n"


def _inlined(module: types.ModuleType) -> str:
    """The text of a module of `thunderfx_debug/scripts/` as a script carries it: its docstring as comments, then its
    code, between lines that name the file, the version of thunderfx-debug it comes from and the file's SHA-256 (the
    first 16 hex digits of `sha256sum` of the file), so that a reader can find the text it was written from."""
    about = "".join(f"# {line}".rstrip() + "\n" for line in inspect.getdoc(module).splitlines())
    version = package_versions().get("thunderfx-debug") or "0+unknown"
    digest = hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:16]
    name = module.__name__.replace(".", "/") + ".py"
    return (f"# ==== {name}, inlined from thunderfx-debug {version} (sha256 of the file {digest}) ====\n"
            f"{about}\n{_module_body(module)}\n# ==== end of {name} ====\n")


def _indent(code: str) -> str:
    return textwrap.indent(code, "    ")


#: Source lines a script's docstring lists; the rest are counted.
SOURCES_LISTED = 12


def _listed(sources: tuple[str, ...]) -> str:
    listed = "".join(f"#     {source}\n" for source in sources[:SOURCES_LISTED])
    rest = len(sources) - SOURCES_LISTED
    return listed + (f"#     ... and {rest} more lines\n" if rest > 0 else "")


def _where_in_the_model(sources: tuple[str, ...], reads_saved_from: tuple[str, ...] = ()) -> str:
    """The header's comment lines that say where in the model the piece is: its ops' lines, and for a backward
    region the forward's lines that made the saved values it reads (none for a piece without either). Comments, not
    the docstring: a path is written as it is, whatever characters it holds."""
    text = ""
    if sources:
        text += ("# where in the model (the lines of its code this piece's ops came from, most ops first):\n"
                 + _listed(sources))
    if reads_saved_from:
        text += (f"# {READS_SAVED} (the forward's lines whose ops made the values saved for the backward that this\n"
                 "# piece reads, most reads first; not lines of its own ops):\n" + _listed(reads_saved_from))
    return text


def _in_docstring(text: str) -> str:
    """`text` as the docstring shows it, whatever characters it holds (an exception's message, a split reason)."""
    return text.replace("\\", "\\\\").replace('"""', "\\\"\"\"")


def _the_run_failure(run_failure: dict[str, Any] | None) -> str:
    """The header's comment lines that say what the piece raised in the run (comments, not the docstring: an
    exception's message is written as it is, whatever characters it holds)."""
    if run_failure is None:
        return ""
    lines = [f"# in the run, {run_failure.get('piece', 'the piece')} raised "
             f"{script_template.the_run_raised(run_failure)}"]
    if run_failure.get("raised_code"):
        lines.append(f"#     {run_failure['raised_code']}")
    message = run_failure.get("message", "").strip().splitlines()
    lines += [f"#   {line}" for line in message[1:8]]
    return "".join(line.replace("\r", " ") + "\n" for line in lines)


def render(piece: ReproSubject, strategy: Strategy, script_path: str, versions: str,
           mismatch: dict[str, Any] | None = None) -> str:
    """The text of the script at `script_path` (relative to the rank directory) running `piece` with `strategy`.

    `mismatch` makes it a mismatch script (`script_template.check_mismatch`): the call, phase, findings and values
    of the first mismatching call the correctness sentinel saw; its inputs file is the piece's `inputs_path`."""
    file_name = posixpath.basename(script_path)
    metas = strategy.metas(piece)
    if piece.real:
        relative = posixpath.relpath(piece.inputs_path, posixpath.dirname(script_path))
        inputs_code = (
            f"# The values of the run's {piece.which_call} of this piece, and what that call returned (saved at the\n"
            "# end of the run; torch.load with weights_only=True).\n"
            f"INPUTS_FILE = {relative!r}\n\n\n"
            "def make_inputs():\n"
            f"    return {strategy.loaded_inputs(piece, 'load_inputs(INPUTS_FILE, __file__)[0]')}\n\n\n"
            "def saved_outputs():\n    return load_inputs(INPUTS_FILE, __file__)[1]"
        )
        note = (f"the values the run passed on its {piece.which_call} of this piece, loaded from the file next to this "
                "script.")
    elif piece.takes_run_integers:
        relative = posixpath.relpath(piece.inputs_path, posixpath.dirname(script_path))
        listed = repro_inputs.make_inputs_code(metas, piece.names, piece.run_integers).removeprefix("return ")
        inputs_code = (
            f"# The integer and bool inputs of the run's {piece.which_call} of this piece, as the run passed them\n"
            "# (they index, select and mask: drawn at random they would not keep what they index), saved at the end\n"
            "# of the run (torch.load with weights_only=True); the other inputs random.\n"
            f"INPUTS_FILE = {relative!r}\n\n\n"
            "def make_inputs():\n"
            "    run = load_inputs(INPUTS_FILE, __file__)[0]\n"
            "    # Random values laid out as the run's inputs were (shapes, strides, storage offsets and\n"
            "    # sizes, dtypes, devices), drawn like the run's values (ranges, sentinels, masks).\n"
            + _indent(f"inputs = {listed}\nreturn {strategy.loaded_inputs(piece, 'inputs')}")
        )
        note = (f"the integer and bool ones as the run passed them on its {piece.which_call} of this piece, loaded "
                "from the "
                "file next to this script; the others random, made from the metadata of that call (layout, dtype, "
                "device, value range).")
    else:
        inputs_code = ("def make_inputs():\n"
                       "    # Random values laid out as the run's inputs were (shapes, strides, storage offsets and\n"
                       "    # sizes, dtypes, devices), drawn like the run's values (ranges, sentinels, masks).\n"
                       + _indent(repro_inputs.make_inputs_code(metas, piece.names)))
        note = f"random, made from the metadata of the run's {piece.which_call} (layout, dtype, device, value range)."
        if piece.captured is not None and piece.captured.skipped:
            note += f" The real values were not saved: {piece.captured.skipped}."
    for extra_note in (piece.inputs_note, strategy.inputs_note(piece)):
        if extra_note:
            note += " " + extra_note
    saved_outputs = piece.real and piece.captured.outputs is not None
    if piece.real and not saved_outputs:
        note += " The run's outputs were not saved (the piece failed, or they were over the cap)."
    is_eager = isinstance(strategy, Eager)
    if is_eager:
        check = ("runs it eagerly and checks its outputs against the run's" if saved_outputs
                 else "runs it eagerly (forward and backward)")
    else:
        check = ("checks its forward outputs against the run's and gradients against eager's" if saved_outputs
                 else "checks it against eager PyTorch (forward outputs and gradients)")
    mismatch_argument = ""
    if mismatch is not None:
        check = ("compares what the run produced with eager, and runs the piece again to see whether the mismatch "
                 "reproduces; exit 1 (the mismatch happened in the run)")
        inputs_file = posixpath.relpath(piece.inputs_path, posixpath.dirname(script_path)) if piece.real else None
        mismatch_argument = f"        mismatch={ {**mismatch, 'inputs_file': inputs_file}!r},\n"
        if piece.real:
            note = (f"the values the run passed on call {mismatch.get('call')} of this piece (the first it "
                    "mismatched on), loaded from the file next to this script.")
    run_failure = piece.run_failure
    if run_failure is not None:
        check = ("runs it as the run did and expects the exception the run raised: REPRODUCED (exit 7) where it "
                 "raises it, NOT REPRODUCED (exit 8) where it runs")
    random_note = ""
    draws = piece.draws if isinstance(strategy, ThunderJit) else None
    random_ops = () if draws else tuple(piece.random_ops)
    if draws:
        random_note = (f"\nRandom ops ({', '.join(piece.random_ops)}): the eager reference draws them as Thunder drew "
                       f"them ({DRAWS_SAID[draws]}),\nfrom the same seed: the values are compared, a difference is a "
                       "MISMATCH.")
    elif random_ops:
        random_note = (f"\nRandom ops ({', '.join(piece.random_ops)}): every run starts from the same seed (and inductor "
                       "calls eager's random ops);\nwhere the values still differ, the script says NOT COMPARABLE "
                       "(exit 5), never OK.")
    needs_thunder = strategy.needs_thunder or piece.needs_thunder
    requirements = "torch" + (", lightning-thunder" if needs_thunder else "")
    requirements += ", nvFuser" if isinstance(strategy, NvFuserRegion) else ""
    definitions = piece.definitions.strip()
    extra = strategy.definitions(piece)
    if extra:
        definitions += "\n\n\n" + extra
    support = ""
    if needs_thunder:
        support = ("\n# ==== Thunder support: the workarounds the installed versions need "
                   "(thunderfx_debug/thunder/script_support.py) ====\n" + _module_body(script_support))
    expected = "saved_outputs" if saved_outputs else "None"
    benchmark_line = "" if mismatch is not None else (
        f"    python {file_name} --benchmark [--json PATH]  # and times it (forward{', backward' if piece.backward else ''})\n")
    header = (
        f'"""{piece.key}: {piece.title}, run with {strategy.description}.\n\n'
        f"{_in_docstring(piece.description)}\n\n"
        f"Written by thunderfx_debug at the end of a training run; needs {requirements} (not thunderfx_debug):\n"
        f"    python {file_name}                            # {check}\n"
        + benchmark_line +
        f"{EXIT_STATUS.format(backend=strategy.backend)}\n"
        f"Inputs: {textwrap.fill(note, 110, subsequent_indent='    ')}{random_note}\n"
        + (textwrap.fill(strategy.executors_note, 110, subsequent_indent="    ") + "\n"
           if getattr(strategy, "executors_note", "") else "")
        + '"""\n'
        f"# versions: {versions}\n"
        + _the_run_failure(run_failure)
        + _where_in_the_model(piece.sources, piece.reads_saved_from)
    )
    main_call = (
        'if __name__ == "__main__":\n'
        "    sys.exit(main(\n"
        f"        piece={piece.key!r},\n"
        f"        executor={strategy.executor!r},\n"
        f"        backend={strategy.backend!r},\n"
        "        build=build,\n"
        "        eager=eager,\n"
        "        make_inputs=make_inputs,\n"
        f"        expected_outputs={expected},\n"
        f"        backward={piece.backward},\n"
        f"        random_ops={random_ops!r},\n"
        + (f"        draws={draws!r},\n" if draws else "") +
        f"        refusal={strategy.refusal(piece)},\n"
        + mismatch_argument
        + (f"        run_failure={run_failure!r},\n" if run_failure else "") +
        "    ))\n"
    )
    imports = "\n".join(dict.fromkeys(piece.imports))
    return (
        header
        + "\n# ==== What every thunderfx_debug repro script runs: inputs, the check, timing "
          "(thunderfx_debug/artifacts/repro/script_template.py) ====\n"
        + inlined_source(script_template)
        + support
        + "\n\n# ==== The piece ====\n"
        + (imports + "\n\n\n" if imports else "")
        + definitions + "\n\n\n"
        + inputs_code + "\n\n\n"
        + "def eager():\n" + _indent(f"return {piece.instance()}") + "\n\n\n"
        + "def build():\n" + _indent(strategy.build_body(piece)) + "\n\n\n"
        + main_call
    )
