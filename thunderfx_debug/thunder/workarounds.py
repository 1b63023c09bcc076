"""Version-gated workarounds for Thunder and torch, each naming the upstream issue it works around and the versions
it applies to, so that it can be deleted when those versions are no longer supported. The workarounds themselves
live in `script_support`, which repro scripts carry too, so that a script does what the run did.

Only one of them is installed on `import thunderfx_debug`: the one `import thunder` itself needs on the installed
torch (`install_import_workaround`, lightning-thunder#2829). It imports neither torch nor thunder; an import hook
applies it when (and if) Thunder's module loads. The others apply inside ReportingBackend only: Thunder's own
`ThunderCompiler` is left as Thunder ships it (tests and benchmarks that need it as a baseline on torch >= 2.12 use
`eager_graph_module_code` around its calls, visibly). One more applies to the lowering of fusion regions to torch calls
that the repro scripts and the correctness sentinel use (`region_lowering_executors`), not to the run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from thunderfx_debug.thunder.script_support import (  # noqa: F401  (the package's names for them)
    LazyInductorModule,
    eager_graph_module_code,
    make_inductor_compile,
    named_tensor_placeholders,
    needs_eager_graph_module_code,
    needs_lazy_inductor_fallback,
    needs_named_tensor_placeholders,
    package_version,
    parse_version,
)


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
        sys.meta_path.insert(0, _ThunderImportFinder("thunder.torch", named_tensor_placeholders))


def lazy_inductor_compile_seconds(split_module) -> float | None:
    """How long inductor took to compile an inductor split at its first call (`LazyInductorModule`); None where the
    split was compiled in the backend call (dynamic shapes, newer Thunder). Thunder 0.2.6 wraps the callable of an
    inductor split in a module whose `fn` it is (thunder/dynamo/splitter.py, `ModuleWrapper`)."""
    inner = getattr(split_module, "fn", split_module)
    return inner.compile_seconds if isinstance(inner, LazyInductorModule) else None


def exec_as_source_file(source: str, filename: str, namespace: dict[str, Any]) -> None:
    """Executes generated `source` into `namespace` with `filename` registered in linecache, so that
    `inspect.getsourcefile` finds the functions it defines.

    torch.compile of a function without a source file wraps it in `external_utils.wrap_inline`, whose `inner` code
    object all such functions then share: Dynamo caches every one of them under that one code object, and after
    `recompile_limit` (8) functions it stops compiling them (pytorch/pytorch#124269; seen on torch 2.11, fixed in
    2.13, which traces exec'd functions directly). With a linecache entry each function is traced as itself, on
    every torch; the entry also gives Dynamo's messages the source lines."""
    import linecache

    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # mtime None: checkcache never drops it
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102  (Thunder's lowering of a region)


def needs_philox_state_as_tensors() -> bool:
    """lightning-thunder <= 0.2.6 (and its main branch at 1e22aacb, 2026): see `region_lowering_executors`."""
    version = package_version("lightning-thunder")
    return version is not None and version <= (0, 2, 6)


def region_lowering_executors() -> tuple:
    """Executors that go before Thunder's torch executor when a fusion region is lowered to torch calls
    (`scripts.region_torch_function`).

    Thunder replaces dropout's `uniform` with `uniform_philox`, whose seed and offset are the numbers
    `get_and_update_rng_state` returns at run time (lightning-thunder#481): in a region they are inputs, IntegerProxy
    objects. Its torch executor lowers `uniform_philox` to `torch.ops.rngprims.philox_rand`, which takes the seed and
    offset as tensors, and turns them into tensors only where they are Python int literals
    (thunder/executors/torchex.py, `_uniform_philox_transform`: `ltorch.tensor(seed) if isinstance(seed, int)`): with
    a proxy the lowering passes the number, and every call refuses it ("Expected a value of type 'Tensor' for
    argument 'seed' but instead found type 'int'"). No upstream issue was found. This executor lowers such a call as
    Thunder lowers a literal one: the numbers become int64 scalar tensors on the host (what philox_rand hands to
    `torch.cuda.set_rng_state`), the rest is Thunder's own transform. The offset is counted as CUDA's generator
    counts it: Thunder's is nvFuser's, a quarter of PyTorch's (`_get_and_update_rng_state_impl` returns
    `pytorch_offset // 4`, after nvFuser's "Note [Divide offset by 4]", csrc/rng.cpp), and CUDA's generator takes only
    multiples of 4 ("offset must be a multiple of 4" where philox_rand set the state with Thunder's number as it is).
    Where the workaround does not apply: none.
    """
    return (_philox_state_as_tensors(),) if needs_philox_state_as_tensors() else ()


#: PyTorch's philox offsets per unit of Thunder's (and nvFuser's): see `region_lowering_executors`.
PHILOX_OFFSET_UNIT = 4


@functools.cache
def _philox_state_as_tensors():
    import thunder.torch as ltorch
    from thunder.core import dtypes, prims
    from thunder.core.proxies import NumberProxy
    from thunder.executors.torchex import _uniform_philox_transform
    from thunder.extend import OperatorExecutor

    def as_tensor(value):
        return ltorch.full((), value, device="cpu", dtype=dtypes.int64) if isinstance(value, NumberProxy) else value

    def has_number_state(shape, minval=0.0, maxval=1.0, *, device, dtype, seed, offset) -> bool:
        return isinstance(seed, NumberProxy) or isinstance(offset, NumberProxy)

    def lowering(shape, minval=0.0, maxval=1.0, *, device, dtype, seed, offset):
        pytorch_offset = ltorch.mul(as_tensor(offset), PHILOX_OFFSET_UNIT) if isinstance(offset, NumberProxy) else offset
        return _uniform_philox_transform(shape, minval, maxval, device=device, dtype=dtype, seed=as_tensor(seed),
                                         offset=pytorch_offset)

    executor = OperatorExecutor("thunderfx_debug_philox_state")  # not registered: used by the lowering alone
    for symbol in (prims.uniform_philox, ltorch.uniform_philox):
        executor.register_implementation(symbol, checker=has_number_state, execution_transform=lowering)
    return executor
