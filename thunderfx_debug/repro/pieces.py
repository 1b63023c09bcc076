"""Turns the recorded graphs, splits and fusion regions into `writers.Piece`s and renders their scripts."""

from __future__ import annotations

import dataclasses

import torch

from thunderfx_debug import layout, thunder_adapter
from thunderfx_debug.records import InputMeta, SplitKind
from thunderfx_debug.repro import inputs as repro_inputs
from thunderfx_debug.repro import writers
from thunderfx_debug.repro.writers import MODULE_CLASS, Piece


def versions_line() -> str:
    from thunderfx_debug.manifest import package_versions

    return ", ".join(f"{name} {version}" for name, version in package_versions().items() if version is not None)


def _placeholder_names(gm: torch.fx.GraphModule) -> list[str]:
    return [node.name for node in gm.graph.find_nodes(op="placeholder")]


def _module_definitions(gm: torch.fx.GraphModule) -> str:
    """The module's code as a class; refuses modules that hold tensors as attributes (they are not inputs, so a
    standalone script would not have them)."""
    for node in gm.graph.find_nodes(op="get_attr"):
        target = gm
        for part in str(node.target).split("."):
            target = getattr(target, part, None)
        if not isinstance(target, torch.fx.GraphModule):
            raise ValueError(
                f"the module reads the attribute {node.target!r} (a {type(target).__name__}), which a standalone "
                "script cannot rebuild"
            )
    return thunder_adapter.module_source(gm, MODULE_CLASS)


def _needs_backward(metas) -> bool:
    return any(m.kind == "tensor" and m.requires_grad for m in metas)


class PieceBuilder:
    """Collects the artifacts of one graph's scripts (see `thunderfx_debug.repro`)."""

    def __init__(self, snapshot, backend):
        self.snapshot, self.state = snapshot, snapshot.state
        self.failures = backend.recorder.failures
        self.thunder_options = dict(backend.thunder_options)
        self.real = backend.config.inputs.value == "real"
        self.executor_names = thunder_adapter.executor_names(self.thunder_options)
        self.versions = versions_line()
        self.fx_imports = tuple(thunder_adapter.fx_builtin_imports())
        self.artifacts: list = []
        self._saved_inputs: set[str] = set()
        self._split_metas: dict[str, tuple[InputMeta, ...]] = {}

    # ---- artifacts ------------------------------------------------------------------------------------------------
    def _add(self, owner: str, label: str, path: str, content) -> None:
        from thunderfx_debug.dump import Artifact

        self.artifacts.append(Artifact(owner, label, path, content))

    def _write(self, owner: str, piece: Piece, strategy: writers.Strategy, path: str) -> None:
        with self.failures.guard(f"writing the {strategy.file_kind} repro of {piece.key}"):
            text = writers.render(piece, strategy, path, self.versions)
            if piece.real and piece.inputs_path not in self._saved_inputs:
                self._add(owner, "inputs", piece.inputs_path, repro_inputs.saved_file(piece.captured))
                self._saved_inputs.add(piece.inputs_path)
            self._add(owner, f"repro_{strategy.file_kind}", path, text)

    # ---- graphs ---------------------------------------------------------------------------------------------------
    def graph_scripts(self) -> None:
        from thunderfx_debug.repro import inputs_path

        state = self.state
        with self.failures.guard(f"preparing the repro scripts of {state.name}"):
            facts = state.facts
            description = f"The Dynamo graph {state.name} (compile id {facts.get('compile_id')}) as handed to the backend."
            if state.error:
                description += " It FAILED under Thunder in the run; the thunder script reproduces the failure."
            piece = Piece(
                key=state.name,
                title="Dynamo graph",
                description=description,
                definitions=_module_definitions(state.gm),
                callable_name=MODULE_CLASS,
                is_module=True,
                metas=state.input_meta,
                backward=_needs_backward(state.input_meta),
                captured=state.real_inputs if self.real else None,
                inputs_path=inputs_path(state.name),
                imports=self.fx_imports,
            )
            for strategy in (
                writers.Eager(),
                writers.ThunderFX(self.thunder_options, self.executor_names),
                writers.TorchCompile(),
            ):
                self._write(state.name, piece, strategy, layout.graph_script(state.name, strategy.file_kind))

    # ---- splits ---------------------------------------------------------------------------------------------------
    def split_metas(self, split_state) -> tuple[InputMeta, ...]:
        """A split's input metadata, with value ranges borrowed from the graph inputs it receives directly."""
        name = split_state.name
        if name in self._split_metas:
            return self._split_metas[name]
        piece = split_state.piece
        names = _placeholder_names(piece.original_module)
        sources: dict[str, InputMeta] = {}
        split_gm = self.state.split_gm
        if split_gm is not None:
            graph_inputs = {node.name: i for i, node in enumerate(split_gm.graph.find_nodes(op="placeholder"))}
            for node in split_gm.graph.find_nodes(op="call_module", target=name):
                for placeholder, arg in zip(names, node.args):
                    index = graph_inputs.get(getattr(arg, "name", None))
                    if index is not None and index < len(self.state.input_meta):
                        sources[placeholder] = self.state.input_meta[index]
        metas = repro_inputs.borrow_value_ranges(piece.input_meta, sources, names)
        self._split_metas[name] = metas
        return metas

    def split_scripts(self, split) -> None:
        from thunderfx_debug.repro import inputs_path

        graph, state = self.state.name, split.state
        key = f"{graph}/{state.name}"
        with self.failures.guard(f"preparing the repro scripts of {key}"):
            metas = self.split_metas(state)
            kind = state.piece.kind
            description = f"The {kind.value} split {state.name} of {graph}, as ThunderFX cut it out of the Dynamo graph."
            if state.piece.reasons:
                reasons = "; ".join(f"{r.type}: {r.info}" for r in state.piece.reasons)[:1500]
                description += f"\nWhy ThunderFX gave it to inductor: {reasons}"
            if state.error:
                description += "\nIt FAILED in the run; the thunder script reproduces the failure."
            piece = Piece(
                key=key,
                title=f"{kind.value} split",
                description=description,
                definitions=_module_definitions(state.piece.original_module),
                callable_name=MODULE_CLASS,
                is_module=True,
                metas=metas,
                backward=_needs_backward(metas),
                captured=state.real_inputs if self.real else None,
                inputs_path=inputs_path(graph, state.name),
                imports=self.fx_imports,
            )
            strategies: list[writers.Strategy] = [writers.Eager()]
            if kind is SplitKind.THUNDER:
                strategies.append(writers.ThunderJit(self.thunder_options, self.executor_names))
            strategies.append(writers.InductorSplit())
            for strategy in strategies:
                self._write(key, piece, strategy, layout.split_script(graph, state.name, strategy.file_kind))

    # ---- fusion regions -------------------------------------------------------------------------------------------
    def fusion_scripts(self, split, region) -> None:
        graph, split_name = self.state.name, split.state.name
        phase = region.phase.value
        key = f"{graph}/{split_name}/{region.name}_{phase}"
        with self.failures.guard(f"preparing the repro scripts of {key}"):
            source, ctx = thunder_adapter.region_torch_function(region.bsym, region.name)
            assignments = writers.context_assignments(source, ctx, thunder_adapter.torch_executor_op_names())
            split_metas = dict(zip(_placeholder_names(split.state.piece.original_module), self.split_metas(split.state)))
            metas = repro_inputs.borrow_value_ranges(region.input_meta, split_metas, region.inputs)
            # Fusion regions run inside Thunder's traces, outside autograd: their inputs need no gradient.
            metas = tuple(dataclasses.replace(m, requires_grad=False) for m in metas)
            piece = Piece(
                key=key,
                title=f"{phase} fusion region {region.name} ({region.executor})",
                description=(
                    f"The {phase} fusion region {region.name} of the Thunder split {split_name} of {graph}: its ops, "
                    "lowered to torch calls by Thunder's torch executor, as the function below."
                ),
                definitions="\n".join(assignments) + "\n\n\n" + _strip_header(source),
                callable_name=region.name,
                is_module=False,
                metas=metas,
                backward=False,
                inputs_note=(
                    "Fusion regions are always reproduced from metadata: their inputs are intermediate values of the "
                    "split's trace."
                ),
            )
            strategies: list[writers.Strategy] = [writers.InductorRegion()]
            if region.executor == "nvfuser":
                with self.failures.guard(f"reading nvFuser's fusion definition of {key}"):
                    definition = thunder_adapter.nvfuser_repro_source(region.bsym)
                    strategies.insert(0, writers.NvFuserRegion(definition))
                    # Both scripts get the layouts the run's tensors had: nvFuser's definition requires them.
                    piece.metas = repro_inputs.in_nvfuser_layouts(piece.metas, definition)
            for strategy in strategies:
                path = layout.fusion_script(graph, split_name, region.name, phase, strategy.file_kind)
                self._write(key, piece, strategy, path)


def _strip_header(source: str) -> str:
    """Drops the "# Constructed by ..." provenance line Thunder puts first; keeps the imports and the function."""
    lines = source.strip().splitlines()
    while lines and lines[0].startswith("# Constructed by"):
        lines.pop(0)
    return "\n".join(lines)
