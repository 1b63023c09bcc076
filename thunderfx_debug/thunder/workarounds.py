"""Version-gated workarounds for Thunder and torch, each naming the upstream issue it works around and the versions
it applies to, so that it can be deleted when those versions are no longer supported.

Only one of them is installed on `import thunderfx_debug`: the one `import thunder` itself needs on the installed
torch (`install_import_workaround`). It imports neither torch nor thunder; an import hook applies it when (and if)
Thunder's module loads. The others apply inside ReportingBackend only: Thunder's own `ThunderCompiler` is left as
Thunder ships it (tests and benchmarks that need it as a baseline on torch >= 2.12 use `eager_graph_module_code`
around its calls, visibly).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import re
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger("thunderfx_debug")

# Torch 2.13 removed named tensors (pytorch#173895); Thunder <= 0.2.6 lists these five methods in a module-level dict
# of thunder/torch/default_torch_ops.py (registered by thunder/torch/__init__.py), so `import thunder` fails with
# AttributeError. We give torch.Tensor placeholders while thunder.torch loads. Upstream fix:
# lightning-thunder PR #2829 (drops the entries on torch >= 2.13).
NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


def parse_version(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); pre-release tags count as the release they lead to.

    Example:
        >>> parse_version("2.13.0.dev20260101+cu130")
        (2, 13, 0)
    """
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def package_version(package: str) -> tuple[int, ...] | None:
    try:
        return parse_version(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        return None


def _thunder_at_most(version: str) -> bool:
    thunder = package_version("lightning-thunder")
    return thunder is not None and thunder <= parse_version(version)


def needs_named_tensor_placeholders() -> bool:
    """torch >= 2.13 with lightning-thunder <= 0.2.6 (lightning-thunder#2829)."""
    torch = package_version("torch")
    return torch is not None and torch >= (2, 13) and _thunder_at_most("0.2.6")


def needs_eager_graph_module_code() -> bool:
    """torch >= 2.12 with lightning-thunder <= 0.2.6 (lightning-thunder#2825).

    torch 2.12 made GraphModule code lazy by default; Thunder's interpreter then traces torch.fx's code generator
    on the first call of a split and fails with "object of type 'MappingKeysView' has no len()".
    """
    torch = package_version("torch")
    return torch is not None and torch >= (2, 12) and _thunder_at_most("0.2.6")


def needs_lazy_inductor_fallback() -> bool:
    """lightning-thunder <= 0.2.6 compiles each inductor split eagerly with fake inputs whose strides can be wrong
    (AssertionError "expected size 8==8, stride 0==1" on a Hugging Face Llama); fixed upstream by compiling on the
    first real call (lightning-thunder#2689)."""
    return _thunder_at_most("0.2.6")


@contextlib.contextmanager
def _named_tensor_placeholders():
    import torch

    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _removed_method(name))
            added.append(name)
    try:
        yield
    finally:
        # Removed again right after Thunder's table is built: nothing can call them, so Thunder's entries for them
        # are unreachable, and torch.Tensor is left as torch shipped it.
        for name in added:
            delattr(torch.Tensor, name)


def _removed_method(name: str) -> Callable[..., Any]:
    def removed(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError(f"torch.Tensor.{name} was removed in torch 2.13 (named tensors)")

    removed.__name__ = removed.__qualname__ = name
    removed.__module__ = "torch"
    return removed


def eager_graph_module_code():
    """Context in which torch.fx builds GraphModules with their code generated at once (see
    `needs_eager_graph_module_code`). A no-op where the workaround does not apply."""
    if not needs_eager_graph_module_code():
        return contextlib.nullcontext()
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(False)


class _PatchingLoader(importlib.abc.Loader):
    """Runs a module's own loader inside a context (the placeholders exist only while the module executes)."""

    def __init__(self, loader: importlib.abc.Loader, around: Callable[[], Any]):
        self._loader, self._around = loader, around

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with self._around():
            self._loader.exec_module(module)


class _ThunderImportFinder(importlib.abc.MetaPathFinder):
    """Loads one of Thunder's modules inside a context (Thunder is not imported just for this)."""

    def __init__(self, module: str, around: Callable[[], Any]):
        self.module, self.around = module, around

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.around)
        return spec


_installed = False


def install_import_workaround() -> None:
    """Makes `import thunder` work on torch >= 2.13 with Thunder <= 0.2.6 (lightning-thunder#2829), when it is
    imported after thunderfx_debug. Idempotent; called by `import thunderfx_debug`; changes nothing else."""
    global _installed
    if _installed:
        return
    _installed = True
    if needs_named_tensor_placeholders() and "thunder.torch" not in sys.modules:
        sys.meta_path.insert(0, _ThunderImportFinder("thunder.torch", _named_tensor_placeholders))


class LazyInductorModule:
    """An inductor split compiled on its first call, with the real inputs (lightning-thunder#2689; see
    `needs_lazy_inductor_fallback`). Used only for static shapes: with dynamic inputs Thunder's own eager compile
    keeps the symbolic shapes that a compile from real inputs would specialise."""

    def __init__(self, graph_module, inductor_compile: Callable):
        self.graph_module = graph_module
        self.graph = graph_module.graph  # thunder's splitter and print_readable look for it
        self._inductor_compile = inductor_compile
        self._compiled: Callable | None = None
        self.compile_seconds: float | None = None  # host time of the compile at the first call (compile cost)

    def __call__(self, *args):
        if self._compiled is None:
            from torch._subclasses.fake_tensor import DynamicOutputShapeException

            started = time.perf_counter()
            try:
                self._compiled = self._inductor_compile(self.graph_module, list(args))
            except DynamicOutputShapeException as e:
                # The same fallback thunder's splitter takes at compile time.
                log.warning("inductor cannot compile a split with a data-dependent output shape (%s); running it eagerly", e)
                self._compiled = self.graph_module
            self.compile_seconds = time.perf_counter() - started
        return self._compiled(*args)


def lazy_inductor_compile_seconds(split_module) -> float | None:
    """How long inductor took to compile an inductor split at its first call (`LazyInductorModule`); None where the
    split was compiled in the backend call (dynamic shapes, newer Thunder). Thunder 0.2.6 wraps the callable of an
    inductor split in a module whose `fn` it is (thunder/dynamo/splitter.py, `ModuleWrapper`)."""
    inner = getattr(split_module, "fn", split_module)
    return inner.compile_seconds if isinstance(inner, LazyInductorModule) else None


def make_inductor_compile(dynamic_inputs: bool) -> Callable:
    """The inductor-compile function to hand Thunder's splitter."""
    import torch

    if dynamic_inputs or not needs_lazy_inductor_fallback():
        return torch._inductor.compile

    def lazy_inductor_compile(graph_module, _fake_args):
        return LazyInductorModule(graph_module, torch._inductor.compile)

    return lazy_inductor_compile
