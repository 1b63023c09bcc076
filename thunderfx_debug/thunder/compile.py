"""Splitting and compiling a Dynamo graph exactly as `thunder.dynamo.ThunderCompiler.__call__` of Thunder 0.2.6 does,
with an inductor-compile function of the caller's (see `script_support.make_inductor_compile`). The steps are in
`script_support.split_graph`, which the ThunderFX repro scripts run too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.thunder.script_support import eager_graph_module_code, make_inductor_compile, split_graph


def compile_graph(gm: torch.fx.GraphModule, sample_args: Sequence[Any], thunder_options: dict[str, Any],
                  inductor_compile: Callable):
    """Returns (split graph module, Thunder's SubgraphInfo). The caller appends the SubgraphInfo to its
    `subgraph_infos`, as ThunderCompiler does."""
    return split_graph(gm, sample_args, thunder_options, inductor_compile)


def has_dynamic_inputs(sample_args: Sequence[Any]) -> bool:
    from thunder.dynamo.compiler import is_dynamic_inputs

    return is_dynamic_inputs(sample_args)


def plain_thunder_compiler(lazy_inductor_fallback: bool = False, **options):
    """`thunder.dynamo.ThunderCompiler(**options)` as Thunder ships it, but for the one workaround it needs to run
    at all on torch >= 2.12 with Thunder <= 0.2.6 (lightning-thunder#2825: its splits are built with eager GraphModule
    code). The baseline that tests and benchmarks compare ReportingBackend with; `import thunderfx_debug` does not
    change ThunderCompiler itself.

    `lazy_inductor_fallback=True` also compiles its inductor splits on their first call with the real inputs, as
    ReportingBackend does (lightning-thunder#2689): the workaround a Hugging Face Llama needs to train under
    ThunderCompiler 0.2.6 at all (see `script_support.needs_lazy_inductor_fallback`)."""
    from thunder.dynamo import ThunderCompiler

    class PlainThunderCompiler(ThunderCompiler):
        def __call__(self, gm, sample_args):
            if lazy_inductor_fallback:
                split_gm, info = compile_graph(gm, sample_args, self.thunder_options,
                                               make_inductor_compile(has_dynamic_inputs(sample_args)))
                self.subgraph_infos.append(info)
                return split_gm
            with eager_graph_module_code():
                return super().__call__(gm, sample_args)

    return PlainThunderCompiler(**options)
