"""The package's structure: no import cycles, imports only downwards through the layers below (imports inside
functions and under TYPE_CHECKING included), Thunder's private names read only in `thunderfx_debug/thunder/`, torch's
private APIs called only there, and `import thunderfx_debug` leaving Thunder as it ships.

The layers, bottom first; a module imports from its own layer and those below it, never from one above:

1. records and settings: `records`, `config`, `layout`, `safety`, `runs`, `sigterm`, `stats` (the statistics the
   diff's noise model and the flush-time triage share), `models` (the demo's models): import nothing above;
2. render: `render/`, `report`, `progress`: records in, text out (so a dump renders without torch or Thunder);
3. dump: `dump`: a dump's files written and read back;
4. thunder: `thunder/`: Thunder's internals, and torch's private APIs (`thunder/torch_private.py`);
5. recording: `recording/`, `manifest`: the training path and what it records;
6. artifacts: `artifacts/`: snapshots in, the `Report` and the dump's files out; the repro scripts;
7. flush-time work: `flush/`, `minimize/`: what a flush runs on the recorded pieces in processes of their own (the
   triage against inductor, the minimizer, the workers that run them and `verify`'s scripts), their results handed
   to the artifacts as records;
8. the run: `flusher`, `backend`, the package itself (`thunderfx_debug/__init__.py`);
9. commands: `cli`, `__main__`, `demo`, `bench`, `bench_worker`, `bench_report`, `verify`.
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


#: (layer, its modules: a name and what lies under it, relative to the package; "" is the package's __init__),
#: bottom first (see the module docstring).
LAYERS = (
    ("records and settings", ("records", "config", "layout", "safety", "runs", "sigterm", "stats", "models")),
    ("render", ("render", "report", "progress")),
    ("dump", ("dump",)),
    ("thunder", ("thunder",)),
    ("recording", ("recording", "manifest")),
    ("artifacts", ("artifacts",)),
    ("flush-time work", ("flush", "minimize")),
    ("the run", ("flusher", "backend", "")),
    ("commands", ("cli", "__main__", "demo", "bench", "bench_worker", "bench_report", "verify")),
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


#: Private names of torch that any module may use, and why.
TORCH_PRIVATE_ANYWHERE = {
    # Dynamo's own pytree (flatten, map over nested outputs): kept stable for torch's own users; no public twin.
    "torch.utils._pytree": "torch's pytree",
    # The spin kernel a CUDA-event timer queues its calls behind (the package's timing primitive and the repro
    # scripts' copy of it); torch has no public kernel that holds the device for a given time.
    "torch.cuda._sleep": "the timers' spin kernel",
}
#: Modules outside `thunder/` that may use torch's private APIs, and why.
TORCH_PRIVATE_MODULES = {
    # The repro scripts' template: a script stands alone (torch, thunder, nvFuser only), so it cannot call the
    # package's wrappers and carries its own (inductor's config for `fallback_random`).
    "thunderfx_debug.artifacts.repro.script_template": "a standalone script",
    # A demo model: `torch._dynamo.graph_break()` stands for user code that breaks the graph, as user code calls it.
    "thunderfx_debug.models": "user code's graph break",
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
