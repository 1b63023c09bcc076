"""`thunderfx-debug minimize SCRIPT`: a repro or mismatch script of a split or a fusion region, read as the piece
it holds (its own code, its own `build()`, its own inputs), shrunk to its minimal script next to it.

What is read from the script (a thunderfx_debug repro script; anything else is refused, saying so): the arguments
of its `main(...)` call (piece, executor, backend, whether it has a backward, its random ops, a mismatch), the piece
`eager()` returns (a class whose `forward` is a split, or a region's torch function), the code before it that the
piece needs (imports, the torch executor's helpers), and the body of `build()`, which every trial keeps: a split is
built as its script builds it (Thunder with the run's options and executors), an inductor region as Thunder's
torch.compile executor does. An nvFuser region's script runs nvFuser's definition of the region, which has no
ops to cut that its torch function would match one for one: its trials hand the region's torch ops back to Thunder
with nvFuser, and the minimal script is nvFuser's definition of what is left (see `piece`).
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
import runpy
import textwrap
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.minimize.piece import NotMinimized, Reduction, minimal_name, minimize_piece
from thunderfx_debug.minimize.shrink import full_values
from thunderfx_debug.minimize.statements import NotAPiece, PieceCode
from thunderfx_debug.minimize.trials import TrialRunner
from thunderfx_debug.minimize.verdict import ScriptVerdict
from thunderfx_debug.minimize.writing import KeptBuild, PieceSpec, ThroughThunder

log = logging.getLogger("thunderfx_debug")

PIECE_MARKER = "# ==== The piece ===="
#: Runs of the script given: its verdict must be the same each time (else the failure is random).
SCRIPT_RUNS = 2


class NotAScript(ValueError):
    """The file is not a thunderfx_debug repro script that can be minimized; the message says why."""


@dataclasses.dataclass
class ScriptPiece:
    """The piece a script holds, ready to be minimized: its spec and code, the script's namespace (its code run
    as a module, not as `__main__`) and the inputs its `make_inputs()` builds."""

    path: Path
    spec: PieceSpec
    code: PieceCode
    namespace: dict[str, Any]
    inputs: list[Any]
    mismatch: bool


def _main_arguments(tree: ast.Module) -> dict[str, ast.expr]:
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "main":
                    return {k.arg: k.value for k in call.keywords if k.arg}
    raise NotAScript("it has no `main(...)` call under `if __name__ == \"__main__\"`: not a thunderfx_debug repro "
                     "script (minimize takes a script from a dump, or one written by minimize)")


def _literal(arguments: dict[str, ast.expr], key: str, default: Any = None) -> Any:
    if key not in arguments:
        return default
    try:
        return ast.literal_eval(arguments[key])
    except ValueError:
        return default


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if found is None:
        raise NotAScript(f"it defines no `{name}()`: not a thunderfx_debug repro script")
    return found


def _body_text(source: str, function: ast.FunctionDef) -> str:
    lines = source.splitlines()
    return textwrap.dedent("\n".join(lines[function.body[0].lineno - 1:function.end_lineno]))


def _file_kind(name: str, executor: str) -> tuple[str, str]:
    """(stem, backend) from a script's name: graph0_thunder_0_repro_mismatch_thunder.py -> (graph0_thunder_0,
    thunder)."""
    found = re.match(r"^(?P<stem>.+?)_(?:minimal_)?repro_(?:mismatch_)?(?P<kind>[a-z]+)\.py$", name)
    if found is None:
        return Path(name).stem, executor
    return found["stem"], found["kind"]


def read_script(path: Path) -> ScriptPiece:
    """The piece `path` holds (see the module docstring); NotAScript where it holds none this can cut."""
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        raise NotAScript(f"it cannot be read as Python ({type(e).__name__}: {e})") from None
    arguments = _main_arguments(tree)
    executor = _literal(arguments, "executor", "")
    if executor == "eager":
        raise NotAScript("it runs the piece eagerly, which it has nothing to compare with; minimize the script of "
                         "the backend (thunder, inductor, nvfuser)")
    returned = _function(tree, "eager").body[-1]
    value = getattr(returned, "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        name = value.func.id
    elif isinstance(value, ast.Name):
        name = value.id
    else:
        raise NotAScript("its `eager()` returns neither a module instance nor a function")
    lines = source.splitlines()
    if PIECE_MARKER not in lines:
        raise NotAScript(f"it has no {PIECE_MARKER!r} section: not a thunderfx_debug repro script")
    start = lines.index(PIECE_MARKER) + 1
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None)
    if node is None:
        raise NotAScript(f"it does not define the piece {name} that `eager()` returns")
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    try:
        code = PieceCode.parse("\n".join(lines[first - 1:node.end_lineno]), name)
    except NotAPiece as e:
        raise NotAScript(f"its piece cannot be cut into ops: {e}") from None
    stem, file_kind = _file_kind(path.name, executor)
    backend = _literal(arguments, "backend", executor)
    heading = (ast.get_docstring(tree) or "").splitlines()[:1]
    described = re.search(r", run with (.*)\.$", heading[0]) if heading else None
    title = re.sub(r" that MISMATCHED.*$", "", heading[0].split(": ", 1)[-1].split(", run with ")[0]) if heading \
        else "piece"
    needs_thunder = "def import_thunder(" in source
    body = _body_text(source, _function(tree, "build"))
    region_executor = ""
    if executor == "nvfuser":
        # nvFuser's definition has no ops that the region's torch function matches one for one: the trials hand the
        # function back to Thunder with nvFuser (see `piece`).
        region_executor, needs_thunder, file_kind = "nvfuser", True, "thunder"
        strategy = ThroughThunder("nvfuser")
    else:
        strategy = KeptBuild(executor, file_kind, backend, described[1] if described else executor, body,
                             needs_thunder)
    spec = PieceSpec(
        key=_literal(arguments, "piece", stem), stem=stem, title=title, file_kind=file_kind, strategy=strategy,
        prelude="\n".join(lines[start:first - 1]).strip(), backward=bool(_literal(arguments, "backward", True)),
        random_ops=tuple(_literal(arguments, "random_ops", ())), needs_thunder=needs_thunder, origin=path.name,
        executor=region_executor, run_failure=_literal(arguments, "run_failure", None))
    try:
        namespace = runpy.run_path(str(path), run_name="thunderfx_debug_minimize")
        torch.manual_seed(namespace["SEED"])
        inputs = list(namespace["make_inputs"]())
    except Exception as e:
        raise NotAScript(f"its inputs could not be made ({type(e).__name__}: {str(e)[:300]})") from None
    return ScriptPiece(path, spec, code, namespace, inputs, "mismatch" in arguments)


def _refusal(piece: ScriptPiece, runs: list[ScriptVerdict]) -> str | None:
    """Why the script's own runs leave nothing to minimize (None: they fail, the same way each time)."""
    first = runs[0]
    if any(run.failing for run in runs) and not all(first.same_failure_as(run) for run in runs[1:]):
        seen = "; ".join(dict.fromkeys(run.describe() for run in runs))
        return (f"its failure is random: identical runs said {seen}; a random failure cannot be shrunk (each cut "
                "would be judged by chance): report it with the script as it is")
    if first.outcome == "NOT_REBUILT" and "is not registered here" in first.line:
        return (f"it cannot build its piece here ({first.line.split(': ', 1)[-1].split('; ')[0]}): register the "
                "run's executors in this environment first (import the module that defines them, e.g. from a "
                "sitecustomize on PYTHONPATH) and run minimize again")
    if first.outcome in ("OK", "NOT_COMPARABLE", "REFUSED", "NOT_REBUILT", "NOT_REPRODUCED"):
        what = {"OK": "it passes", "NOT_COMPARABLE": "its values cannot be compared (random ops, or picks among ties)",
                "REFUSED": "its inputs were refused (a bug of thunderfx_debug's input rebuild, not of the backend)",
                "NOT_REBUILT": "the script itself could not rebuild its piece, so the backend never ran it (a bug of "
                               "the script, not of the backend)",
                "NOT_REPRODUCED": "the piece failed in the run but runs here: nothing here fails (report it with the "
                                  "run's dump)"}
        return (f"its verdict is {first.outcome.replace('_', ' ')}: {what[first.outcome]}; minimize takes a script "
                "that says MISMATCH, CRASH or REPRODUCED")
    if first.outcome == "MISMATCH" and first.reproduces is False:
        return ("the mismatch it holds was seen in the run only (running the piece again here matches eager): "
                "nothing here fails; report it with the run's dump")
    if not first.failing:
        return f"it gave no verdict ({first.describe()}); run it alone to see why"
    return None


def minimize_script(path: Path, budget_s: float, out: Path | None = None,
                    runner: TrialRunner | None = None) -> Reduction:
    """Minimizes the piece of the script at `path`, writing `<piece>_minimal_repro_<backend>.py` next to it (or
    `out`); NotAScript or NotMinimized (with why, and what to do) where there is nothing to write."""
    piece = read_script(path)
    runner = runner or TrialRunner("server")
    log.info("thunderfx_debug: running %s (%d times) to learn its verdict", path.name, SCRIPT_RUNS)
    runs = [runner.run(path.resolve()) for _ in range(SCRIPT_RUNS)]
    refusal = _refusal(piece, runs)
    if refusal is not None:
        raise NotMinimized(refusal)
    from thunderfx_debug.artifacts.repro.builder import versions_line

    values = full_values(piece.code, piece.namespace, piece.inputs, grad=piece.spec.backward)
    out_dir, out_name = (path.parent, None) if out is None else (out.parent, out.stem)
    reduction = minimize_piece(piece.spec, piece.code, values, runner, budget_s, out_dir, versions_line(),
                               script_runs=runs, out_name=out_name)
    if reduction.script is None:
        raise NotMinimized(reduction.note)
    return reduction


def default_output(path: Path, file_kind: str) -> Path:
    stem, _ = _file_kind(path.name, file_kind)
    return path.with_name(minimal_name(stem, file_kind) + ".py")
