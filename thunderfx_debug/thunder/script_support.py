"""What a repro script that runs Thunder needs beyond torch, thunder and nvFuser themselves: the workarounds that
the installed versions need (each gated on the versions and naming its upstream issue), the run's executors by
name, Thunder's torch-executor helpers by name, and ThunderFX compiling a graph exactly as the run did.

thunderfx_debug copies this module's source into the scripts that use Thunder (after `script_template`), and its
own workarounds (`workarounds`) and compile path (`compile`) use the same functions, so a script does what the run
did. It imports only the standard library at module level: `import thunderfx_debug` stays free of torch.

The workarounds, for lightning-thunder <= 0.2.6:
- torch >= 2.13 removed named tensors (pytorch#173895); Thunder lists five of their methods in a module-level dict
  of thunder/torch/default_torch_ops.py, so `import thunder` fails with AttributeError. Placeholders on
  torch.Tensor while Thunder loads, removed right after (lightning-thunder#2829 drops the entries on torch >= 2.13).
- torch >= 2.12 generates GraphModule code lazily; Thunder's interpreter then traces torch.fx's code generator on the
  first call of a split and fails with "object of type 'MappingKeysView' has no len()" (lightning-thunder#2825):
  GraphModules built with their code generated at once.
- Thunder compiles each inductor split eagerly with fake inputs whose strides can be wrong (AssertionError "expected
  size 8==8, stride 0==1" on a Hugging Face Llama); fixed upstream by compiling on the first real call
  (lightning-thunder#2689).
"""

import contextlib
import importlib
import importlib.metadata
import re
import sys
import time
import warnings

NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


def parse_version(text):
    """'2.13.0+cpu' -> (2, 13, 0); pre-release tags count as the release they lead to.

    Example:
        >>> parse_version("2.13.0.dev20260101+cu130")
        (2, 13, 0)
    """
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def package_version(package):
    try:
        return parse_version(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        return None


def _thunder_at_most(version):
    thunder = package_version("lightning-thunder")
    return thunder is not None and thunder <= parse_version(version)


def needs_named_tensor_placeholders():
    """torch >= 2.13 with lightning-thunder <= 0.2.6 (lightning-thunder#2829)."""
    torch_version = package_version("torch")
    return torch_version is not None and torch_version >= (2, 13) and _thunder_at_most("0.2.6")


def needs_eager_graph_module_code():
    """torch >= 2.12 with lightning-thunder <= 0.2.6 (lightning-thunder#2825)."""
    torch_version = package_version("torch")
    return torch_version is not None and torch_version >= (2, 12) and _thunder_at_most("0.2.6")


def needs_lazy_inductor_fallback():
    """lightning-thunder <= 0.2.6 (lightning-thunder#2689)."""
    return _thunder_at_most("0.2.6")


def _removed_method(name):
    def removed(*args, **kwargs):
        raise AttributeError(f"torch.Tensor.{name} was removed in torch 2.13 (named tensors)")

    removed.__name__ = removed.__qualname__ = name
    removed.__module__ = "torch"
    return removed


@contextlib.contextmanager
def named_tensor_placeholders():
    """Placeholders for the named-tensor methods torch 2.13 removed, on torch.Tensor inside the block only."""
    import torch

    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _removed_method(name))
            added.append(name)
    try:
        yield
    finally:
        # Removed right after Thunder's table is built: nothing can call them, so its entries for them are
        # unreachable, and torch.Tensor is left as torch shipped it.
        for name in added:
            delattr(torch.Tensor, name)


def import_thunder():
    """`import thunder`, with the placeholders it needs on torch >= 2.13 (lightning-thunder#2829)."""
    if "thunder" not in sys.modules and needs_named_tensor_placeholders():
        with named_tensor_placeholders():
            import thunder  # noqa: F401
    import thunder

    return thunder


def eager_graph_module_code():
    """Context in which torch.fx builds GraphModules with their code generated at once (lightning-thunder#2825);
    a no-op where the installed versions do not need it."""
    if not needs_eager_graph_module_code():
        return contextlib.nullcontext()
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(False)


class MissingExecutor(LookupError):
    """An executor the run used is not registered in this process, so the piece cannot be built as the run built it:
    no claim about Thunder (a script says NOT REBUILT, naming the executor)."""


def import_executor_module(module, folder):
    """Imports `module`, the module that registered a custom executor in the run: as this process finds it, else
    from `folder`, the folder of the run's sys.path it was imported from (appended to sys.path, behind what this
    process finds first)."""
    try:
        importlib.import_module(module)
        return
    except ModuleNotFoundError as error:
        if folder is None or error.name not in (module, module.split(".")[0]):
            raise
    sys.path.append(folder)
    importlib.import_module(module)


def executors(names, modules=None):
    """The run's Thunder executors, by name. `modules` maps a custom executor's name to (the module that registered
    it in the run, the folder it was imported from), or to (None, why no script can import it): that module is
    imported first where the executor is not registered yet. MissingExecutor where one cannot be had."""
    import_thunder()
    from thunder.extend import get_executor

    found = []
    for name in names:
        executor = get_executor(name)
        module, where = (modules or {}).get(name, (None, None))
        if executor is None and module is not None:
            try:
                import_executor_module(module, where)
            except Exception as error:
                raise MissingExecutor(
                    f"the run's executor {name!r} is not registered here: importing {module!r} (the module that "
                    f"registered it in the run, from {where}) raised {type(error).__name__}: {error}") from error
            executor = get_executor(name)
            if executor is None:
                raise MissingExecutor(f"the run's executor {name!r} is not registered here: importing {module!r} did "
                                      "not register it (the run registered it later than at import)")
            print(f"  executor {name!r}: registered by importing {module!r}, as in the run")
        if executor is None:
            why = f" ({where})" if where else ""
            raise MissingExecutor(f"the run's executor {name!r} is not registered here{why}: register it (import the "
                                  "module that defines it) before this script builds the piece")
        found.append(executor)
    return found


def torch_executor_fn(name):
    """The callable behind an operator of Thunder's torch executor (e.g. `shallow_copy`, `torch_pad_prim_impl`),
    which a fusion region's torch code calls: some have no importable name (lambdas), so they are looked up."""
    import_thunder()
    from thunder.core.symbol import BoundSymbol
    from thunder.executors.torchex import ex as torch_ex

    symbol = torch_ex.opmap[name]
    bound = BoundSymbol(symbol, args=(), kwargs={}, output=None)
    symbol._bind_postprocess(bound)  # the executor puts its implementation in the call context here
    return bound._call_ctx[name]


class LazyInductorModule:
    """An inductor split compiled on its first call, with the real inputs (lightning-thunder#2689). Used only for
    static shapes: with dynamic inputs Thunder's own eager compile keeps the symbolic shapes that a compile from
    real inputs would specialise."""

    def __init__(self, graph_module, inductor_compile):
        self.graph_module = graph_module
        self.graph = graph_module.graph  # thunder's splitter and print_readable look for it
        self._inductor_compile = inductor_compile
        self._compiled = None
        self.compile_seconds = None  # host time of the compile at the first call (the backend's compile cost)

    def __call__(self, *args):
        if self._compiled is None:
            from torch._subclasses.fake_tensor import DynamicOutputShapeException

            started = time.perf_counter()
            try:
                self._compiled = self._inductor_compile(self.graph_module, list(args))
            except DynamicOutputShapeException as e:
                # The same fallback thunder's splitter takes at compile time.
                warnings.warn(f"inductor cannot compile a split with a data-dependent output shape ({e}); "
                              "running it eagerly")
                self._compiled = self.graph_module
            self.compile_seconds = time.perf_counter() - started
        return self._compiled(*args)


def make_inductor_compile(dynamic_inputs):
    """The inductor-compile function to hand Thunder's splitter: compiled on the first real call where
    lightning-thunder#2689 applies and the shapes are static, `torch._inductor.compile` otherwise."""
    import torch

    if dynamic_inputs or not needs_lazy_inductor_fallback():
        return torch._inductor.compile

    def lazy_inductor_compile(graph_module, _fake_args):
        return LazyInductorModule(graph_module, torch._inductor.compile)

    return lazy_inductor_compile


def split_graph(gm, sample_args, thunder_options, inductor_compile):
    """(split graph module, Thunder's SubgraphInfo): `thunder.dynamo.ThunderCompiler.__call__` of Thunder 0.2.6,
    step for step, with `inductor_compile` for the inductor splits and GraphModule code generated eagerly."""
    from functools import partial

    from thunder import jit
    from thunder.dynamo.compiler import _with_prologue_pruning_transform, is_dynamic_inputs, is_in_torch_compile
    from thunder.dynamo.splitter import _splitter
    from thunder.dynamo.utils import recompile_graph, remove_empty_autocast

    remove_empty_autocast(gm)
    recompile_graph(gm)
    options = _with_prologue_pruning_transform(
        current_thunder_options=thunder_options,
        is_torch_compile_without_dynamic=is_in_torch_compile() and not is_dynamic_inputs(sample_args),
    )
    with eager_graph_module_code():
        return _splitter(gm, partial(jit, **options), inductor_compile, sample_args, options)


def thunder_compiler(**options):
    """`thunder.dynamo.ThunderCompiler(**options)` compiling as the run did: as shipped where no workaround applies,
    else with the workarounds of lightning-thunder#2825 and #2689 (see the module docstring)."""
    import_thunder()
    from thunder.dynamo import ThunderCompiler
    from thunder.dynamo.compiler import is_dynamic_inputs

    if not (needs_eager_graph_module_code() or needs_lazy_inductor_fallback()):
        return ThunderCompiler(**options)

    class ThunderCompilerAsInTheRun(ThunderCompiler):
        def __call__(self, gm, sample_args):
            inductor_compile = make_inductor_compile(is_dynamic_inputs(sample_args))
            split_module, info = split_graph(gm, sample_args, self.thunder_options, inductor_compile)
            self.subgraph_infos.append(info)
            return split_module

    return ThunderCompilerAsInTheRun(**options)
