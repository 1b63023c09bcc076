"""The package's structure: no import cycles (imports inside functions and under TYPE_CHECKING included), Thunder's
private names read only in `thunderfx_debug/thunder/`, and `import thunderfx_debug` leaving Thunder as it ships."""

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
