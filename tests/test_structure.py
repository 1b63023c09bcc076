"""The package's structure: no import cycles, imports only downwards through the layers below (imports inside
functions and under TYPE_CHECKING included), a few arrows the order would allow but the design forbids, Thunder's
private names read only in `thunderfx_debug/thunder/`, torch's private APIs called only there, and `import
thunderfx_debug` leaving Thunder as it ships.

The layers are folders, bottom first; a module imports from its own layer and those below it, never from one above:

1. scripts: `scripts/`: what every repro script carries (the judging rule, the CUDA-event timer), imported by the
   package and inlined as text into each script: torch and the standard library only, nothing of the package;
2. records and settings: `records/` (the records, their JSON form, the dump's file names, the statistics of
   timings), `settings/` (the settings, the fail-safe): import nothing above;
3. render: `render/`: records in, text out (so a dump renders without torch or Thunder), `Report` and progress;
4. dump: `dump/`: a dump's files written and read back, the run id;
5. thunder: `thunder/`: Thunder's internals, and torch's private APIs (`thunder/torch_private.py`);
6. recording: `recording/`: the training path and what it records (the run's manifest facts included);
7. artifacts: `artifacts/`: snapshots in, the `Report` and the dump's files out; the repro scripts;
8. children: `children/`: every process the package starts and how it talks to it (forks, a fork server, long-lived
   workers, a script where the package cannot be imported), and the one choice between a fork and a fresh
   interpreter; it takes from `scripts/` and `thunder/` only, and only the layers above it start children;
9. triage: `triage/`: what a flush runs on the recorded pieces in processes of their own (the triage against
   inductor), its results handed to the artifacts as records;
10. minimize: `minimize/`: the minimizer, whose trials run in those processes;
11. the run: `run/` (the backend, the flusher, the flush on SIGTERM), the package itself
    (`thunderfx_debug/__init__.py`);
12. commands: `commands/` (the CLI and what each command runs, the demo's model), `__main__`.

The package's root holds `__init__.py` and `__main__.py` only; every other module lies in a layer's folder.
The training path (`recording/`, `thunder/`) never imports the dump writer (`dump/`, `artifacts/`) or the renderers
(`render/`), though `dump/` and `render/` lie below it. A module of `scripts/` imports torch and the standard library
only, and nothing `from __future__`: a script carries its text, after code of its own, where nothing else of the
package can be imported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "thunderfx_debug"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) for every import statement in the file, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` imports the module a.b where there is one, else a name of a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name deeper than a module
                target = target.rpartition(".")[0]
            if target:
                found.append((target, node.lineno))
    return found


#: (layer, its folders relative to the package; "" is the package's __init__, "__main__" its `python -m` entry),
#: bottom first (see the module docstring).
LAYERS = (
    ("scripts", ("scripts",)),
    ("records and settings", ("records", "settings")),
    ("render", ("render",)),
    ("dump", ("dump",)),
    ("thunder", ("thunder",)),
    ("recording", ("recording",)),
    ("artifacts", ("artifacts",)),
    ("children", ("children",)),
    ("triage", ("triage",)),
    ("minimize", ("minimize",)),
    ("the run", ("run", "")),
    ("commands", ("commands", "__main__")),
)
#: The modules the package's root may hold besides its folders ("" is the package's __init__).
ROOT_MODULES = ("", "__main__")
#: Arrows the order of the layers allows but the design forbids: (who, what it never imports, why). The training
#: path records in memory; writing the dump and rendering it happen at flush and offline.
FORBIDDEN = (
    (("recording", "thunder"), ("dump", "artifacts"), "the training path never imports the dump writer"),
    (("recording", "thunder"), ("render",), "the training path never imports the renderers"),
)


def _layer(module: str, layers=LAYERS) -> int | None:
    """The index of the layer `module` ("thunderfx_debug.render.text") belongs to, the longest name matching."""
    relative = module.partition(".")[2]
    best = None
    for i, (_, names) in enumerate(layers):
        for name in names:
            if relative == name or (name and relative.startswith(f"{name}.")):
                if best is None or len(name) > len(best[1]):
                    best = (i, name)
    return None if best is None else best[0]


def _upward_imports(modules: dict[str, Path], layers=LAYERS) -> list[str]:
    """Every import of a module from a layer above its own, and every module in no layer."""
    found = []
    for name, path in sorted(modules.items()):
        own = _layer(name, layers)
        if own is None:
            found.append(f"{name} is in no layer (add it to LAYERS)")
            continue
        for target, line in sorted(set(_imports(name, path, modules)), key=lambda t: (t[1], t[0])):
            theirs = _layer(target, layers)
            if theirs is not None and theirs > own:
                found.append(f"{name}:{line} ({layers[own][0]}) imports {target} ({layers[theirs][0]})")
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def test_the_package_has_no_import_cycle():
    modules = _modules()
    graph = {name: {target for target, _ in _imports(name, path, modules)} - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_import(tmp_path):
    # The test above must be able to fail: a cycle closed only by an import inside a function is one.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    (tmp_path / "m.py").write_text("def f():\n    from pkg import n\n")
    assert _imports("pkg.m", tmp_path / "m.py", {"pkg.m": tmp_path / "m.py", "pkg.n": tmp_path / "n.py"}) == [("pkg.n", 2)]


def test_every_import_goes_down_the_layers():
    assert _upward_imports(_modules()) == []


def test_the_layer_check_finds_an_upward_import_inside_a_function_and_under_type_checking(tmp_path):
    # The test above must be able to fail: a low module importing a higher one, however deferred, is found.
    (tmp_path / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n"
                                     "def f():\n    import pkg.high\n")
    (tmp_path / "high.py").write_text("from pkg import low\n")
    (tmp_path / "stray.py").write_text("")
    modules = {f"pkg.{n}": tmp_path / f"{n}.py" for n in ("low", "high", "stray")}
    layers = (("bottom", ("low",)), ("top", ("high",)))
    assert _upward_imports(modules, layers) == [
        "pkg.low:3 (bottom) imports pkg.high (top)", "pkg.low:5 (bottom) imports pkg.high (top)",
        "pkg.stray is in no layer (add it to LAYERS)"]


def _misplaced(package: Path, layers=LAYERS, root=ROOT_MODULES) -> list[str]:
    """Every layer's name that is not a folder of the package whose `__init__.py` says what it holds, every module
    of the root that is not one of `root`, and every folder of the package that is no layer's."""
    found = []
    folders = {name for _, names in layers for name in names if name not in root}
    for name in sorted(folders):
        init = package / name / "__init__.py"
        if not init.is_file():
            found.append(f"{name}/ is not a package folder")
        elif not ast.get_docstring(ast.parse(init.read_text())):
            found.append(f"{name}/__init__.py has no docstring")
    for path in sorted(package.glob("*.py")):
        if path.stem != "__init__" and path.stem not in root:
            found.append(f"{path.name} lies in the package's root, in no layer's folder")
    for path in sorted(package.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file() and path.name not in folders:
            found.append(f"{path.name}/ is no layer's folder (add it to LAYERS)")
    return found


def test_every_layer_is_a_folder_and_the_root_holds_only_init_and_main():
    assert _misplaced(PACKAGE) == []


def test_the_folder_check_finds_a_loose_module_a_stray_folder_and_a_folder_without_a_docstring(tmp_path):
    # The test above must be able to fail.
    for folder, text in (("low", '"""The bottom."""\n'), ("high", "import os\n"), ("stray", "")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(text)
    for name in ("__init__", "__main__", "loose"):
        (tmp_path / f"{name}.py").write_text("")
    layers = (("bottom", ("low",)), ("top", ("high", "missing", "")), ("entry", ("__main__",)))
    assert _misplaced(tmp_path, layers) == [
        "high/__init__.py has no docstring", "missing/ is not a package folder",
        "loose.py lies in the package's root, in no layer's folder", "stray/ is no layer's folder (add it to LAYERS)"]


def _forbidden_imports(modules: dict[str, Path], forbidden=FORBIDDEN) -> list[str]:
    """Every import from a folder of `forbidden`'s first part of a folder of its second part."""
    def folder(module: str) -> str:
        return module.partition(".")[2].partition(".")[0]

    found = []
    for name, path in sorted(modules.items()):
        for importers, targets, why in forbidden:
            if folder(name) not in importers:
                continue
            for target, line in sorted(set(_imports(name, path, modules)), key=lambda t: (t[1], t[0])):
                if folder(target) in targets:
                    found.append(f"{name}:{line} imports {target}: {why}")
    return found


def test_the_training_path_never_imports_the_dump_writer_or_the_renderers():
    assert _forbidden_imports(_modules()) == []


def test_the_forbidden_arrow_check_finds_a_deferred_import(tmp_path):
    # The test above must be able to fail: `dump/` and `render/` lie below `recording/`, so the layers allow it.
    (tmp_path / "timer.py").write_text("def f():\n    from pkg.render import text\n")
    (tmp_path / "text.py").write_text("")
    modules = {"pkg.recording.timer": tmp_path / "timer.py", "pkg.render.text": tmp_path / "text.py"}
    assert _forbidden_imports(modules) == [
        "pkg.recording.timer:2 imports pkg.render.text: the training path never imports the renderers"]


#: The folder whose modules every repro script carries as text (`artifacts/repro/writers.inlined_source`).
CARRIED = "scripts"


def _carried_imports(modules: dict[str, Path], carried: str = CARRIED) -> list[str]:
    """Every import in a module of the `carried` folder of anything but torch and the standard library (the package
    itself included, that folder too: each module is inlined on its own), and every `from __future__` import (legal
    only at the top of a file, and the text is inlined after the script's own code)."""
    found = []
    for name, path in sorted(modules.items()):
        if name.partition(".")[2].partition(".")[0] != carried:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imported = ["." * node.level + (node.module or "")]
            else:
                continue
            for module in imported:
                root = module.partition(".")[0]
                if module == "__future__":
                    found.append(f"{name}:{node.lineno} imports from __future__, which a script cannot take mid-file")
                elif root != "torch" and root not in sys.stdlib_module_names:
                    found.append(f"{name}:{node.lineno} imports {module}: a script carries torch and the standard "
                                 "library only")
    return found


def test_what_every_script_carries_imports_torch_and_the_standard_library_only():
    assert _carried_imports(_modules()) == []


def test_the_carried_import_check_finds_the_package_a_third_party_and_a_future_import(tmp_path):
    # The test above must be able to fail, also on an import deferred into a function.
    (tmp_path / "rule.py").write_text("from __future__ import annotations\nimport math, torch.cuda\n"
                                      "from torch.overrides import TorchFunctionMode\nimport numpy\n"
                                      "def f():\n    from pkg.scripts import timer\n    from . import timer\n")
    modules = {"pkg.scripts.rule": tmp_path / "rule.py", "pkg.records.x": tmp_path / "rule.py"}
    assert _carried_imports(modules) == [
        "pkg.scripts.rule:1 imports from __future__, which a script cannot take mid-file",
        "pkg.scripts.rule:4 imports numpy: a script carries torch and the standard library only",
        "pkg.scripts.rule:6 imports pkg.scripts: a script carries torch and the standard library only",
        "pkg.scripts.rule:7 imports .: a script carries torch and the standard library only"]


#: Private names of torch that any module may use, and why.
TORCH_PRIVATE_ANYWHERE = {
    # Dynamo's own pytree (flatten, map over nested outputs): kept stable for torch's own users; no public twin.
    "torch.utils._pytree": "torch's pytree",
    # The spin kernel a CUDA-event timer queues its calls behind (`scripts/device_timer.py`, the package's timing
    # primitive, which every repro script carries); torch has no public kernel that holds the device for a given time.
    "torch.cuda._sleep": "the timers' spin kernel",
}
#: Modules outside `thunder/` that may use torch's private APIs, and why.
TORCH_PRIVATE_MODULES = {
    # The repro scripts' template: a script stands alone (torch, thunder, nvFuser only), so it cannot call the
    # package's wrappers and carries its own (inductor's config for `fallback_random`).
    "thunderfx_debug.artifacts.repro.script_template": "a standalone script",
    # A demo model: `torch._dynamo.graph_break()` stands for user code that breaks the graph, as user code calls it.
    "thunderfx_debug.commands.models": "user code's graph break",
    # nvFuser's draws, carried by the scripts: a reference draws the run's numbers outside any torch function mode
    # (the float64 yardstick's would widen them), and torch has no public way out of the mode stack
    # (`torch._C.DisableTorchFunction`).
    "thunderfx_debug.scripts.philox_draws": "draws outside the float64 yardstick's mode",
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _torch_private(source: str) -> list[tuple[str, int]]:
    """(private torch name, line) for every import of, or attribute reached through, a name of torch that starts
    with an underscore (dunders aside), not counting `TORCH_PRIVATE_ANYWHERE`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node) or ""]
        for dotted in names:
            parts = dotted.split(".")
            private = [i for i, p in enumerate(parts) if i and p.startswith("_") and not p.startswith("__")]
            if parts[0] != "torch" or not private:
                continue
            name = ".".join(parts[: private[0] + 1])
            if name not in TORCH_PRIVATE_ANYWHERE:
                found.append((name, node.lineno))
    return sorted(set(found), key=lambda f: (f[1], f[0]))


def test_only_the_thunder_subpackage_calls_torch_private_apis():
    """torch's private APIs (inductor's compile, the c10d bindings, the CUDA allocator's pools, autograd's engine)
    change between releases like Thunder's internals: they are called in `thunder/` only (`thunder/torch_private`),
    but for the names and modules listed above with their reasons."""
    offending = []
    for name, path in _modules().items():
        if name.startswith("thunderfx_debug.thunder.") or name in TORCH_PRIVATE_MODULES:
            continue
        offending += [f"{name}:{line} uses {private}" for private, line in _torch_private(path.read_text())]
    assert offending == []


def test_the_torch_private_check_finds_imports_and_attributes():
    source = ("import torch\nimport torch._dynamo\nfrom torch import _C\nfrom torch.utils._pytree import tree_map\n"
              "def f(gm, args):\n"
              "    return torch._inductor.compile(gm, args), torch.cuda._sleep(1), torch.__version__\n"
              "def g():\n    torch.autograd.Variable._execution_engine.queue_callback(f)\n")
    assert _torch_private(source) == [("torch._dynamo", 2), ("torch._C", 3), ("torch._inductor", 6),
                                      ("torch.autograd.Variable._execution_engine", 8)]


def test_only_the_thunder_subpackage_imports_thunder_internals():
    """Outside `thunderfx_debug/thunder/`, the package imports from Thunder only its public entry points."""
    # `thunder.jit`, `thunder.last_traces`, `ThunderCompiler`, and the torch.compile executor's documented object.
    public = {"thunder", "thunder.dynamo", "thunder.executors.torch_compile"}
    offending = []
    for name, path in _modules().items():
        if name.startswith("thunderfx_debug.thunder"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            offending += [f"{name}:{node.lineno} imports {m}" for m in modules
                          if (m == "thunder" or m.startswith("thunder.")) and m not in public]
    assert offending == []


def test_importing_the_package_changes_nothing_of_thunder():
    """`import thunderfx_debug` before `import thunder` leaves ThunderCompiler and torch.Tensor as they ship."""
    code = (
        "import thunderfx_debug, torch, sys\n"
        "assert 'thunder' not in sys.modules\n"
        "import thunder\n"
        "from thunder.dynamo import ThunderCompiler\n"
        "assert ThunderCompiler.__call__.__module__ == 'thunder.dynamo.compiler', ThunderCompiler.__call__.__module__\n"
        "removed = tuple(int(p) for p in torch.__version__.split('.')[:2]) >= (2, 13)\n"
        "assert not (removed and hasattr(torch.Tensor, 'align_as')), 'a placeholder was left on torch.Tensor'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_thunder_imported_before_the_package_is_an_import_error_that_says_what_to_do():
    """Thunder 0.2.6 on torch 2.13: `import thunder` first fails and leaves Thunder half-loaded. Both ways of then
    importing the package say so, and what to do, instead of "cannot import name 'ReportingBackend'"."""
    from thunderfx_debug.thunder.workarounds import needs_named_tensor_placeholders

    if not needs_named_tensor_placeholders():
        pytest.skip("this torch and Thunder import in either order")
    code = (
        "try:\n"
        "    import thunder\n"
        "except AttributeError as e:\n"
        "    print('thunder failed:', e)\n"
        "for statement in ('import thunderfx_debug', 'from thunderfx_debug import ReportingBackend'):\n"
        "    try:\n"
        "        exec(statement)\n"
        "    except ImportError as e:\n"
        "        print(type(e).__name__, '|', e)\n"
        "    else:\n"
        "        print('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 3, done.stdout + done.stderr[-2000:]
    assert "align_as" in lines[0]
    for line in lines[1:]:
        kind, message = line.split(" | ")
        assert kind == "ThunderImportOrderError"
        assert "Put `import thunderfx_debug` first, before `import thunder`" in message
        assert "restart the interpreter" in message
