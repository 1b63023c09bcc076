"""Splitting and compiling a Dynamo graph exactly as `thunder.dynamo.ThunderCompiler.__call__` of Thunder 0.2.6 does,
with an inductor-compile function of the caller's (see `workarounds.make_inductor_compile`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from thunderfx_debug.thunder.workarounds import eager_graph_module_code


def compile_graph(gm: torch.fx.GraphModule, sample_args: Sequence[Any], thunder_options: dict[str, Any],
                  inductor_compile: Callable):
    """Returns (split graph module, Thunder's SubgraphInfo). The caller appends the SubgraphInfo to its
    `subgraph_infos`, as ThunderCompiler does."""
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


def has_dynamic_inputs(sample_args: Sequence[Any]) -> bool:
    from thunder.dynamo.compiler import is_dynamic_inputs

    return is_dynamic_inputs(sample_args)


def plain_thunder_compiler(**options):
    """`thunder.dynamo.ThunderCompiler(**options)` as Thunder ships it, but for the one workaround it needs to run
    at all on torch >= 2.12 with Thunder <= 0.2.6 (lightning-thunder#2825: its splits are built with eager GraphModule
    code). The baseline that tests and benchmarks compare ReportingBackend with; `import thunderfx_debug` does not
    change ThunderCompiler itself."""
    from thunder.dynamo import ThunderCompiler

    class PlainThunderCompiler(ThunderCompiler):
        def __call__(self, gm, sample_args):
            with eager_graph_module_code():
                return super().__call__(gm, sample_args)

    return PlainThunderCompiler(**options)
