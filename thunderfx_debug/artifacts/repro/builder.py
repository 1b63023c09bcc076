"""Repro and benchmark scripts for graphs, splits and fusion regions, written at flush.

`scripts_for_graph(snapshot, settings, failures)` returns the dump artifacts of one Dynamo graph, as
THUNDERFX_DEBUG_REPRO asks (names in `layout`):

    graph0/graph0_repro_{eager,thunder,torchcompile}.py
    graph0/graph0_thunder_0/graph0_thunder_0_repro_{eager,thunder,inductor}.py     (inductor splits: eager, inductor)
    graph0/graph0_thunder_0/fusions/graph0_thunder_0_TorchCompile0_forward_repro_inductor.py
    graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_{nvfuser,inductor}.py
    graph0/inputs/graph0_inputs.pt, graph0/graph0_thunder_0/inputs/graph0_thunder_0_inputs.pt,
    graph0/graph0_thunder_0/fusions/inputs/graph0_thunder_0_nvFusion0_forward_inputs.pt       (INPUTS=real)
    graph0/graph0_thunder_0/graph0_thunder_0_repro_mismatch_thunder.py, ..._nvFusion0_forward_repro_mismatch_nvfuser.py
        and their inputs/..._mismatch_inputs.pt                       (pieces THUNDERFX_DEBUG_CHECK found mismatching)

A graph that failed under Thunder always gets the scripts of the piece that failed (the split, or the whole graph
when it failed to compile or raised outside its splits; and the fusion region the failure was raised in), whatever
THUNDERFX_DEBUG_REPRO says, with the inputs of the failing call (of the first, for a backward that failed later).
Its scripts that run the backend that raised (Thunder for a split or graph, nvFuser or torch.compile for a region;
the graph's own Thunder script too) expect what the run raised (`script_template.main`'s `run_failure`). The scripts
of a piece the failure kept from running say so. Each script is written independently: one that cannot be written
is recorded as a reporting failure and the others are still written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from thunderfx_debug.records import layout
from thunderfx_debug.artifacts.artifact import Artifact, ArtifactSettings
from thunderfx_debug.artifacts.repro import fx_facts
from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import writers
from thunderfx_debug.artifacts.repro.writers import MODULE_CLASS, ReproSubject
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.settings.config import ReproKind
from thunderfx_debug.recording.manifest import package_versions
from thunderfx_debug.records import FailedIn, InputKind, InputMeta, SplitKind
from thunderfx_debug.recording.capture import Captured
from thunderfx_debug.recording.check import Evidence
from thunderfx_debug.recording.recorder import GraphSnapshot, GraphState, SplitSnapshot
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import options as thunder_options
from thunderfx_debug.thunder import provenance as thunder_provenance
from thunderfx_debug.thunder import scripts as thunder_scripts
from thunderfx_debug.thunder.traces import FusionRegion


#: A piece that gets scripts: (None, None) the graph, (split, None) a split, (split, region) a fusion region.
Piece = tuple[SplitSnapshot | None, FusionRegion | None]


def pieces_with_scripts(snapshot: GraphSnapshot, settings: ArtifactSettings,
                        deviating: Mapping[str, str] | None = None) -> list[Piece]:
    """The pieces of one graph that get scripts, as THUNDERFX_DEBUG_REPRO asks (and the failing piece), and those
    the triage found deviating (`deviating`: owner key -> why, see `triage.deviating`)."""
    deviating = deviating or {}
    state = snapshot.state
    failed_split = state.failed_split if state.error else None
    failed_region = failing_region(snapshot)
    pieces: list[Piece] = []
    if ReproKind.GRAPH in settings.repro or (state.error and failed_split is None):
        pieces.append((None, None))
    for split in snapshot.splits:
        key = PieceKey.of(state.name, split.state.name)
        if ReproKind.SPLIT in settings.repro or split.state.name == failed_split or key in deviating:
            pieces.append((split, None))
        pieces += [(split, region) for region in split.regions
                   if ReproKind.FUSION in settings.repro or key.region(region.key) in deviating
                   or (split.state.name == failed_split and region.key == failed_region)]
    return pieces


def failing_region(snapshot: GraphSnapshot) -> str | None:
    """The key of the fusion region of the failing split that the run's failure was raised in ("nvFusion0_forward"),
    None where it was raised in none (or the region is not among the split's)."""
    failure = snapshot.state.failure
    if failure is None or failure.split is None or failure.facts.region is None:
        return None
    split = next((s for s in snapshot.splits if s.state.name == failure.split), None)
    return failure.facts.region if split is not None and any(r.key == failure.facts.region
                                                            for r in split.regions) else None


def scripts_for_graph(snapshot: GraphSnapshot, settings: ArtifactSettings, failures: ReportingFailures,
                      on_piece: Callable[[str], None] | None = None,
                      deviating: Mapping[str, str] | None = None) -> list[Artifact]:
    """The repro scripts (and saved inputs) of one graph; see the module docstring. `on_piece(name)` is called
    after each piece of `pieces_with_scripts` (for progress). The pieces the correctness sentinel found
    mismatching get their mismatch scripts whatever THUNDERFX_DEBUG_REPRO says. The scripts of a piece the triage
    found deviating and that REPRO did not ask for say why in their names
    (`..._thunder_0_slower_than_inductor_repro_thunder.py`)."""
    builder = ScriptBuilder(snapshot, settings, failures)
    deviating = deviating or {}
    for split, region in pieces_with_scripts(snapshot, settings, deviating):
        key = "/".join(p for p in (snapshot.state.name, split and split.state.name, region and region.key) if p)
        asked = ReproKind.FUSION in settings.repro if region is not None else ReproKind.SPLIT in settings.repro
        builder.why = None if asked else deviating.get(key)
        if split is None:
            builder.graph_scripts()
        elif region is None:
            builder.split_scripts(split)
        else:
            builder.fusion_scripts(split, region)
        if on_piece is not None:
            on_piece("/".join(p for p in (snapshot.state.name, split and split.state.name, region and region.key) if p))
    builder.why = None
    builder.mismatch_scripts()
    return builder.artifacts


def versions_line() -> str:
    return ", ".join(f"{name} {version}" for name, version in package_versions().items() if version is not None)


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
    return thunder_scripts.module_source(gm, MODULE_CLASS)


def _needs_backward(metas) -> bool:
    return any(m.kind is InputKind.TENSOR and m.requires_grad for m in metas)


def _placeholder_names(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    return tuple(node.name for node in gm.graph.find_nodes(op="placeholder"))


class ScriptBuilder:
    """Collects the artifacts of one graph's scripts (see the module docstring)."""

    def __init__(self, snapshot: GraphSnapshot, settings: ArtifactSettings, failures: ReportingFailures):
        self.snapshot, self.state = snapshot, snapshot.state
        self.failures = failures
        self.thunder_options = dict(settings.thunder_options)
        self.real = settings.real_inputs
        self.executor_names = thunder_options.executor_names(self.thunder_options)
        self.executor_modules: dict[str, tuple[str | None, str | None]] = {}
        with failures.guard("finding the modules that registered the run's executors"):
            self.executor_modules = thunder_options.run_executor_modules(self.thunder_options)
        self.versions = versions_line()
        self.fx_imports = tuple(thunder_scripts.fx_builtin_imports())
        self.artifacts: list[Artifact] = []
        self._saved_inputs: set[str] = set()
        self.why: str | None = None  # the current piece's scripts are there because it deviates (see `_named`)
        self._split_metas: dict[str, tuple[InputMeta, ...]] = {}

    # ---- artifacts ------------------------------------------------------------------------------------------------
    def _add(self, owner: str, label: str, path: str, content: str | bytes) -> None:
        self.artifacts.append(Artifact(owner, label, path, content))

    def _write(self, owner: str, piece: ReproSubject, strategy: writers.Strategy, path: str,
               evidence: Evidence | None = None) -> None:
        if evidence is None:
            path = _named(path, self.why)
        what = f"the {strategy.file_kind} {'mismatch script' if evidence else 'repro'} of {piece.key}"
        with self.failures.guard(f"writing {what}"):
            mismatch = None
            if evidence is not None:
                mismatch = {"call": evidence.call, "phase": evidence.phase, "findings": evidence.findings,
                            "compares": "gradients" if evidence.gradients is not None else "outputs",
                            "values": list(evidence.values)}
            text = writers.render(piece, strategy, path, self.versions, mismatch)
            if piece.real and piece.inputs_path not in self._saved_inputs:
                content = (repro_inputs.saved_file(piece.captured) if evidence is None
                           else repro_inputs.saved_file(piece.captured, evidence.gradients))
                self._add(owner, "mismatch_inputs" if evidence else "inputs", piece.inputs_path, content)
                self._saved_inputs.add(piece.inputs_path)
            elif piece.takes_run_integers and piece.inputs_path not in self._saved_inputs:
                content = repro_inputs.run_integers_file(piece.run_integers, len(piece.metas))
                self._add(owner, "mismatch_inputs" if evidence else "inputs", piece.inputs_path, content)
                self._saved_inputs.add(piece.inputs_path)
            self._add(owner, f"repro_mismatch_{strategy.file_kind}" if evidence else f"repro_{strategy.file_kind}",
                      path, text)

    # ---- the run's failure ------------------------------------------------------------------------------------------
    def _run_failure(self, piece: ReproSubject, region: str | None = None) -> dict | None:
        """What the scripts of the backend that raised expect (`script_template.main`'s `run_failure`)."""
        return run_failure_argument(self.state, piece.real, region)

    @staticmethod
    def _expecting(piece: ReproSubject, expects: bool, run_failure: dict | None) -> ReproSubject:
        """`piece` for a script that expects the run's failure (`expects`), or not."""
        return dataclasses.replace(piece, run_failure=run_failure if expects else None)

    # ---- mismatches -----------------------------------------------------------------------------------------------
    def mismatch_scripts(self) -> None:
        """A script for each piece the correctness sentinel found mismatching (whatever THUNDERFX_DEBUG_REPRO says),
        holding its first mismatching call (see `script_template.check_mismatch`)."""
        for split in self.snapshot.splits:
            tally = split.state.check
            if tally is not None and tally.evidence is not None:
                self.split_scripts(split, tally.evidence)
            for region in split.regions:
                region_tally = split.state.region_checks.get(region.key)
                if region_tally is not None and region_tally.evidence is not None:
                    self.fusion_scripts(split, region, region_tally.evidence)

    # ---- graphs ---------------------------------------------------------------------------------------------------
    def graph_scripts(self) -> None:
        state = self.state
        with self.failures.guard(f"preparing the repro scripts of {state.name}"):
            description = f"The Dynamo graph {state.name} (compile id {state.facts.compile_id}) as handed to the backend."
            failure = state.failure
            captured, inputs_call = state.captured, 1
            metas = self.snapshot.input_meta
            if failure is not None:
                description += (f"\nIt FAILED in the run: {_failure_words(state.name, failure)}. Its thunder script "
                                "compiles it as the run did and expects that exception.")
                if failure.graph_captured is not None:
                    captured, metas = failure.graph_captured, _captured_metas(failure.graph_captured, metas)
                    inputs_call = state.calls
                    description += f" Its inputs are those of the failing call ({state.name}'s call {state.calls})."
            metas = repro_inputs.with_fx_bounds(state.gm, metas)
            piece = ReproSubject(
                key=state.name,
                title="Dynamo graph",
                description=description,
                definitions=_module_definitions(state.gm),
                callable_name=MODULE_CLASS,
                is_module=True,
                metas=metas,
                names=_placeholder_names(state.gm),
                backward=_needs_backward(metas),
                captured=captured if self.real else None,
                inputs_path=layout.inputs_file(state.name),
                run_integers=repro_inputs.run_integers(captured, metas),
                imports=self.fx_imports + fx_facts.custom_op_imports(state.gm),
                random_ops=fx_facts.random_ops(state.gm),
                sources=thunder_provenance.module_sources(state.gm),
                inputs_call=inputs_call,
            )
            thunder = writers.ThunderFX(self.thunder_options, self.executor_names, self.executor_modules,
                                        dynamic=state.dynamic)
            for strategy in (writers.Eager(), thunder, writers.TorchCompile()):
                expects = failure is not None and strategy is thunder
                self._write(state.name, self._expecting(piece, expects, self._run_failure(piece)), strategy,
                            layout.graph_script(state.name, strategy.file_kind))

    # ---- splits ---------------------------------------------------------------------------------------------------
    def split_metas(self, split: SplitSnapshot) -> tuple[InputMeta, ...]:
        """`repro_inputs.split_metas` of the split, made once per builder."""
        name = split.state.name
        if name not in self._split_metas:
            self._split_metas[name] = repro_inputs.split_metas(self.snapshot, split)
        return self._split_metas[name]

    def split_scripts(self, split: SplitSnapshot, evidence: Evidence | None = None) -> None:
        """The split's scripts; with `evidence`, its mismatch script instead (Thunder, on the mismatching call)."""
        graph, state = self.state.name, split.state
        key = PieceKey.of(graph, state.name)
        with self.failures.guard(f"preparing the repro scripts of {key}"):
            metas = self.split_metas(split)
            kind = state.split.kind
            description = f"The {kind.value} split {state.name} of {graph}, as ThunderFX cut it out of the Dynamo graph."
            if state.split.reasons:
                reasons = "; ".join(f"{r.type}: {r.info}" for r in state.split.reasons)[:1500]
                description += f"\nWhy ThunderFX gave it to inductor: {reasons}"
            failure = self.state.failure
            failing = failure is not None and failure.split == state.name and evidence is None
            captured, inputs_call = state.captured, 1
            if failing:
                description += (f"\nIt FAILED in the run: {_failure_words(key, failure)}. Its thunder script runs it "
                                "as the run did and expects that exception.")
                if failure.where.captured is not None:
                    captured, inputs_call = failure.where.captured, failure.where.call
                    metas = repro_inputs.with_fx_bounds(state.split.original_module, _captured_metas(captured, metas))
                    description += f" Its inputs are those of the failing call (call {failure.where.call})."
                elif failure.where.call > 1:
                    description += (f" Its inputs are those of its first call: the forward's inputs are not kept on "
                                    f"every call, and the backward of call {failure.where.call} failed.")
            elif self.state.failure is not None and state.calls == 0:
                description += (f"\nIt never ran in the run: {_failure_words(_failed_piece(self.state), failure)}, "
                                "before it was called. Its inputs are made from ThunderFX's example values of the "
                                "graph (shapes, dtypes), not from values the run passed it.")
            if evidence is not None:
                description += _mismatch_description(evidence)
            module = state.split.original_module
            piece = ReproSubject(
                key=key,
                title=f"{kind.value} split" + (" that MISMATCHED eager in the run" if evidence else ""),
                description=description,
                definitions=_module_definitions(module),
                callable_name=MODULE_CLASS,
                is_module=True,
                metas=metas,
                names=_placeholder_names(module),
                backward=_needs_backward(metas),
                captured=captured if self.real else None,
                inputs_path=layout.inputs_file(graph, state.name),
                run_integers=repro_inputs.run_integers(captured, metas),
                imports=self.fx_imports + fx_facts.custom_op_imports(module),
                random_ops=fx_facts.random_ops(module),
                draws=fx_facts.thunder_draws(module, split.fwd_trace) if kind is SplitKind.THUNDER else None,
                sources=state.split.sources,
                inputs_call=inputs_call,
            )
            thunder = writers.ThunderJit(self.thunder_options, self.executor_names, self.executor_modules,
                                         as_split=True)
            if evidence is not None:
                piece.captured = evidence.captured
                piece.inputs_path = layout.mismatch_inputs_file(graph, state.name)
                self._write(key, piece, thunder, layout.mismatch_script(graph, state.name, thunder.file_kind),
                            evidence)
                return
            strategies: list[writers.Strategy] = [writers.Eager()]
            if kind is SplitKind.THUNDER:
                strategies.append(thunder)
            strategies.append(writers.InductorSplit())
            for strategy in strategies:
                expects = failing and strategy is thunder
                self._write(key, self._expecting(piece, expects, self._run_failure(piece)), strategy,
                            layout.split_script(graph, state.name, strategy.file_kind))

    # ---- fusion regions -------------------------------------------------------------------------------------------
    def fusion_scripts(self, split: SplitSnapshot, region: FusionRegion, evidence: Evidence | None = None) -> None:
        """The region's scripts; with `evidence`, its mismatch script instead (nvFuser for an nvFusion region, else
        torch.compile as Thunder's torch.compile executor runs it, on the mismatching call where it was saved)."""
        graph, split_name = self.state.name, split.state.name
        phase = region.phase.value
        key = PieceKey.of(graph, split_name, region.key)
        with self.failures.guard(f"preparing the repro scripts of {key}"):
            source, ctx = thunder_scripts.region_torch_function(region.bsym, region.name)
            assignments, needs_thunder = writers.context_assignments(source, ctx, thunder_scripts.region_helpers(ctx))
            captured = split.region_captures.get(region.key)
            metas = split.region_metas(region)
            note = ""
            if captured is None:
                split_metas = dict(zip(split.state.split.input_names, self.split_metas(split)))
                metas = repro_inputs.borrow_value_ranges(metas, split_metas, region.inputs)
                note = ("This region's call was not captured in the run: its layouts are those of its final trace "
                        "(and of nvFuser's definition).")
            metas = repro_inputs.with_index_bounds(metas, thunder_scripts.region_index_bounds(region.bsym))
            # Fusion regions run inside Thunder's traces, outside autograd: their inputs need no gradient.
            metas = tuple(dataclasses.replace(m, requires_grad=False) for m in metas)
            description = (f"The {phase} fusion region {region.name} of the Thunder split {split_name} of {graph}: its "
                           "ops, lowered to torch calls by Thunder's torch executor, as the function below (the eager "
                           "reference).")
            if thunder_scripts.reproduced_random_ops(region.bsym):
                description += REPRODUCED_DRAWS
            piece = ReproSubject(
                key=key,
                title=f"{phase} fusion region {region.name} ({region.executor})"
                      + (" that MISMATCHED its torch reference in the run" if evidence else ""),
                description=description + (_mismatch_description(evidence) if evidence else ""),
                definitions="\n".join(assignments) + "\n\n\n" + _strip_header(source),
                callable_name=region.name,
                is_module=False,
                metas=metas,
                names=region.inputs,
                backward=False,
                captured=captured if self.real else None,
                inputs_path=layout.inputs_file(graph, split_name, region.key),
                run_integers=repro_inputs.run_integers(captured, metas),
                inputs_note=note,
                random_ops=thunder_scripts.region_random_ops(region.bsym, unreproduced=True),
                needs_thunder=needs_thunder,
                sources=split.sources.regions.get(region.key, ()),
                reads_saved_from=split.sources.regions_reads_saved_from.get(region.key, ()),
            )
            strategies: list[writers.Strategy] = [writers.InductorRegion()]
            if region.executor == "nvfuser":
                with self.failures.guard(f"reading nvFuser's fusion definition of {key}"):
                    strategies.insert(0, writers.NvFuserRegion(thunder_scripts.nvfuser_repro_source(region.bsym)))
            if evidence is not None:
                # the mismatching call's values where the sentinel kept them, else metadata (not another call's)
                piece.captured = evidence.captured
                piece.inputs_path = layout.mismatch_inputs_file(graph, split_name, region.key)
                if evidence.captured is not None and evidence.captured.inputs is not None:
                    piece.inputs_note = ""
                strategy = strategies[0]  # nvFuser for an nvFusion region, else torch.compile
                self._write(key, piece, strategy, layout.mismatch_script(graph, split_name, strategy.file_kind,
                                                                        region.key), evidence)
                return
            failed_here = failing_region(self.snapshot) == region.key and self.state.failure.split == split_name
            if failed_here:
                piece.description += (f"\nThe run's failure was raised in this region: "
                                      f"{_failure_words(f'{graph}/{split_name}', self.state.failure)}. Its "
                                      f"{strategies[0].file_kind} script expects that exception.")
            for strategy in strategies:
                path = layout.fusion_script(graph, split_name, region.name, phase, strategy.file_kind)
                # the backend that raised: nvFuser for an nvFusion region, torch.compile for a TorchCompile one
                expects = failed_here and isinstance(strategy, writers.NvFuserRegion if region.executor == "nvfuser"
                                                     else writers.InductorRegion)
                written = piece
                if isinstance(strategy, writers.InductorRegion) and thunder_scripts.reproduced_random_ops(region.bsym):
                    written = self._with_opaque_draws(piece, region)
                self._write(key, self._expecting(written, expects, self._run_failure(written, region.key)), strategy,
                            path)

    def _with_opaque_draws(self, piece: ReproSubject, region: FusionRegion) -> ReproSubject:
        """The region's piece for its inductor script: its dropout drawn as nvFuser drew it, through a custom op that
        torch.compile calls as it is (`philox_draws.define_nvfuser_uniform_op`: inductor spends minutes compiling
        the draws themselves) while it compiles the region's other ops, fullgraph; compared as in the nvFuser
        script."""
        source, ctx = thunder_scripts.region_torch_function(region.bsym, region.name, draws="nvfuser_opaque")
        assignments, needs_thunder = writers.context_assignments(source, ctx, thunder_scripts.region_helpers(ctx))
        return dataclasses.replace(
            piece, definitions="\n".join(["define_nvfuser_uniform_op()", *assignments]) + "\n\n\n"
            + _strip_header(source), needs_thunder=needs_thunder,
            description=piece.description + OPAQUE_DRAWS)


#: What an nvFusion region's script says of its dropout, drawn as nvFuser drew it (`thunder.draws`).
REPRODUCED_DRAWS = (" Its dropout draws (uniform_philox, from the seed and offset among its inputs) are drawn there "
                    "by nvfuser_uniform, as nvFuser draws them, bit for bit, and its masks compare them in float32, "
                    "as nvFuser does: its values are compared.")
#: What an inductor script adds: how torch.compile meets the draws.
OPAQUE_DRAWS = (" Here the draws go through a custom op (define_nvfuser_uniform_op), which torch.compile calls as it "
                "is while it compiles the other ops.")


def run_failure_argument(state: GraphState, real: bool, region: str | None = None) -> dict | None:
    """What a script that runs the piece with the backend that raised in the run expects (`script_template.main`'s
    `run_failure`; `real`: the script has the run's values), None where the graph did not fail."""
    failure = state.failure
    if failure is None:
        return None
    facts, where = failure.facts, failure.where
    expected = {"piece": _failed_piece(state), "type": facts.type, "message": facts.message,
                "raised_in": facts.raised_in, "raised_at": facts.raised_at, "raised_code": facts.raised_code,
                "failed_in": where.failed_in.value, "call": where.call, "inputs": "real" if real else "rebuilt"}
    if region is not None:
        expected["region"] = region
    return expected


def _failed_piece(state) -> str:
    """"graph0/thunder_0": the piece that raised in the run (the graph where no split did)."""
    failure = state.failure
    return PieceKey.of(state.name, None if failure is None else failure.split)


def _failure_words(piece: str, failure) -> str:
    """"graph0/thunder_0 raised ValueError: ... at tests/x.py:29 f, in the forward of its call 3"."""
    facts, where = failure.facts, failure.where
    message = facts.message.strip().splitlines()
    exception = facts.type + (f": {message[0][:300]}" if message else "")
    at = f" at {facts.raised_at}" if facts.raised_at else ""
    when = (" while ThunderFX split and compiled it" if where.failed_in is FailedIn.COMPILE
            else f", in the {where.failed_in.value} of its call {where.call}")
    return f"{piece} raised {exception}{at}{when}"


def _captured_metas(captured: Captured, fallback: tuple[InputMeta, ...]) -> tuple[InputMeta, ...]:
    """The metadata of a captured call (its statistics read: the flush waited for the device), else `fallback`."""
    metas = captured.metas(wait=True)
    return fallback if metas is None else metas


def _mismatch_description(evidence: Evidence) -> str:
    findings = "\n".join(f"    {line}" for line in evidence.findings)
    return (f"\nIn the run, on call {evidence.call} ({evidence.phase}), the correctness sentinel (THUNDERFX_DEBUG_CHECK) "
            f"found it beyond the tolerance:\n{findings}\nThis script holds that call's inputs and what the run "
            "produced (where they were within THUNDERFX_DEBUG_INPUTS_MAX_MB), compares them with eager, and runs the "
            "piece again here to say whether the mismatch reproduces outside the run.")
def _named(path: str, why: str | None) -> str:
    """`path` with `why` before its "_repro_" part: graph0_thunder_0_slower_than_inductor_repro_thunder.py."""
    if why is None or "_repro_" not in path:
        return path
    head, _, tail = path.rpartition("_repro_")
    return f"{head}_{why}_repro_{tail}"


def _strip_header(source: str) -> str:
    """Drops the "# Constructed by ..." provenance line Thunder puts first; keeps the imports and the function."""
    lines = source.strip().splitlines()
    while lines and lines[0].startswith("# Constructed by"):
        lines.pop(0)
    return "\n".join(lines)
