"""Version-gated workarounds for Thunder and torch, all in one place.

Each workaround names the upstream issue it works around and the versions it applies to, so it can be deleted
when those versions are no longer supported. `install()` runs on `import thunderfx_debug`; it imports neither torch
nor thunder: the patches that touch Thunder are applied by an import hook when (and if) Thunder's module loads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import re
import sys
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
    """'2.13.0+cpu' -> (2, 13, 0); pre-release tags count as the release they lead to."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _version(package: str) -> tuple[int, ...] | None:
    try:
        return parse_version(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_version() -> tuple[int, ...] | None:
    return _version("torch")


def thunder_version() -> tuple[int, ...] | None:
    return _version("lightning-thunder")


def _thunder_at_most(version: str) -> bool:
    thunder = thunder_version()
    return thunder is not None and thunder <= parse_version(version)


def needs_named_tensor_placeholders() -> bool:
    """torch >= 2.13 with lightning-thunder <= 0.2.6 (lightning-thunder#2829)."""
    torch = torch_version()
    return torch is not None and torch >= (2, 13) and _thunder_at_most("0.2.6")


def needs_eager_graph_module_code() -> bool:
    """torch >= 2.12 with lightning-thunder <= 0.2.6 (lightning-thunder#2825).

    torch 2.12 made GraphModule code lazy by default; Thunder's interpreter then traces torch.fx's code generator
    on the first call of a split and fails with "object of type 'MappingKeysView' has no len()".
    """
    torch = torch_version()
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


def _patch_thunder_compiler(module: ModuleType) -> None:
    """Makes plain `thunder.dynamo.ThunderCompiler` build its splits with eager GraphModule code (#2825), so that
    ThunderCompiler itself (the baseline our tests and benchmarks compare with) works on torch >= 2.12."""
    compiler_cls = module.ThunderCompiler
    if getattr(compiler_cls.__call__, "_thunderfx_debug_patched", False):
        return
    original_call = compiler_cls.__call__

    @functools.wraps(original_call)
    def __call__(self, gm, sample_args):
        with eager_graph_module_code():
            return original_call(self, gm, sample_args)

    __call__._thunderfx_debug_patched = True
    compiler_cls.__call__ = __call__


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, around: Callable[[], Any] | None, after: Callable | None):
        self._loader, self._around, self._after = loader, around, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with self._around() if self._around else contextlib.nullcontext():
            self._loader.exec_module(module)
        if self._after:
            self._after(module)


class _ThunderPatchFinder(importlib.abc.MetaPathFinder):
    """Applies the workarounds to Thunder's modules as they are imported (Thunder is not imported just for this)."""

    def __init__(self, patches: dict[str, tuple[Callable | None, Callable | None]]):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        around, after = self.patches[fullname]
        spec.loader = _PatchingLoader(spec.loader, around, after)
        return spec


_installed = False


def install() -> None:
    """Installs the workarounds that apply to the installed versions. Idempotent; called by `import thunderfx_debug`."""
    global _installed
    if _installed:
        return
    _installed = True
    patches: dict[str, tuple[Callable | None, Callable | None]] = {}
    if needs_named_tensor_placeholders() and "thunder.torch" not in sys.modules:
        patches["thunder.torch"] = (_named_tensor_placeholders, None)
    if needs_eager_graph_module_code():
        if "thunder.dynamo.compiler" in sys.modules:
            _patch_thunder_compiler(sys.modules["thunder.dynamo.compiler"])
        else:
            patches["thunder.dynamo.compiler"] = (None, _patch_thunder_compiler)
    if patches:
        sys.meta_path.insert(0, _ThunderPatchFinder(patches))


class LazyInductorModule:
    """An inductor split compiled on its first call, with the real inputs (lightning-thunder#2689; see
    `needs_lazy_inductor_fallback`). Used only for static shapes: with dynamic inputs Thunder's own eager compile
    keeps the symbolic shapes that a compile from real inputs would specialise."""

    def __init__(self, graph_module, inductor_compile: Callable):
        self.graph_module = graph_module
        self.graph = graph_module.graph  # thunder's splitter and print_readable look for it
        self._inductor_compile = inductor_compile
        self._compiled: Callable | None = None

    def __call__(self, *args):
        if self._compiled is None:
            from torch._subclasses.fake_tensor import DynamicOutputShapeException

            try:
                self._compiled = self._inductor_compile(self.graph_module, list(args))
            except DynamicOutputShapeException as e:
                # The same fallback thunder's splitter takes at compile time.
                log.warning("inductor cannot compile a split with a data-dependent output shape (%s); running it eagerly", e)
                self._compiled = self.graph_module
        return self._compiled(*args)


def make_inductor_compile(dynamic_inputs: bool) -> Callable:
    """The inductor-compile function to hand Thunder's splitter."""
    import torch

    if dynamic_inputs or not needs_lazy_inductor_fallback():
        return torch._inductor.compile

    def lazy_inductor_compile(graph_module, _fake_args):
        return LazyInductorModule(graph_module, torch._inductor.compile)

    return lazy_inductor_compile
