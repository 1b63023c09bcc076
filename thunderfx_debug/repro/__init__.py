"""Repro and benchmark scripts for graphs, splits and fusion regions, written at flush (see issue #3).

`scripts_for_graph(snapshot, backend)` returns the dump artifacts of one Dynamo graph, as THUNDERFX_DEBUG_REPRO asks:

    graph0/graph0_repro_{eager,thunder,torchcompile}.py
    graph0/graph0_thunder_0/graph0_thunder_0_repro_{eager,thunder,inductor}.py     (inductor splits: eager, inductor)
    graph0/graph0_thunder_0/fusions/graph0_thunder_0_TorchCompile0_forward_repro_inductor.py
    graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_{nvfuser,inductor}.py
    graph0/inputs/graph0_inputs.pt, graph0/graph0_thunder_0/inputs/graph0_thunder_0_inputs.pt   (INPUTS=real)

A graph that failed under Thunder always gets the scripts of the piece that failed (the split, or the whole graph
when it failed to compile), whatever THUNDERFX_DEBUG_REPRO says. Each script is written independently: one that
cannot be written is recorded as a reporting failure and the others are still written.
"""

from __future__ import annotations

from thunderfx_debug import layout

__all__ = ["scripts_for_graph"]


def scripts_for_graph(snapshot, backend) -> list:
    """The repro scripts (and saved inputs) of one graph as `dump.Artifact`s; see the module docstring."""
    from thunderfx_debug.repro.pieces import PieceBuilder

    state = snapshot.state
    kinds = set(backend.config.repro)
    builder = PieceBuilder(snapshot, backend)
    failed_split = state.failed_piece if state.error else None
    if "graph" in kinds or (state.error and failed_split is None):
        builder.graph_scripts()
    for split in snapshot.splits:
        if "split" in kinds or split.state.name == failed_split:
            builder.split_scripts(split)
        if "fusion" in kinds:
            for region in split.regions:
                builder.fusion_scripts(split, region)
    return builder.artifacts


def inputs_path(graph: str, split: str | None = None) -> str:
    """Where the saved real inputs of a graph (or of one of its splits) go in the dump."""
    if split is None:
        return f"{layout.graph_dir(graph)}/{layout.INPUTS_DIR}/{graph}_inputs.pt"
    return f"{layout.split_dir(graph, split)}/{layout.INPUTS_DIR}/{layout.split_prefix(graph, split)}_inputs.pt"
