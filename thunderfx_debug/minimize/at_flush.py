"""THUNDERFX_DEBUG_MINIMIZE=1: at flush, every piece the correctness sentinel flagged (a Thunder split, a fusion
region), and every Thunder split the run raised in, shrunk to its minimal script (for a split that raised: the
fewest ops that still raise what the run raised, each trial judged by `scripts/run_failure` as its repro script is),
within THUNDERFX_DEBUG_MINIMIZE_BUDGET seconds per piece, in a process of its own (`flush_child`): the training
process only describes the piece and reads back what was written.

The piece is read from the run's own objects: a split's FX graph (printed as its repro scripts print it) and a
region's ops as Thunder's torch executor lowers its bound symbols (the code its scripts carry), with the inputs of
the first call it mismatched on where the sentinel kept them (host copies; of the call that raised, for a split that
raised), else the recorded metadata the scripts rebuild inputs from. The piece's child runs the piece eagerly for
the values its cuts hand on (`shrink.full_values`) and runs the trials in children of its own (`trials`). Where the
training process has not initialised CUDA, the piece's child is a fork of it, and its trials forks of that: they
have the run's executors, so a custom executor's wrong op is found too; a process that uses CUDA starts a fresh
interpreter for the piece instead, whose trials have an executor of the user's where its module registers it on
import (the piece's note says so where one is missing).

How a trial builds the piece: a split with `thunder.jit` and the run's options and executors (as its mismatch
script does); a region of Thunder's torch.compile executor as that executor compiles it (torch.compile of the
region's torch ops); any other region, nvFuser's included, by handing its ops back to Thunder with the region's own
executor (for nvFuser the minimal script is then nvFuser's definition of the minimal region, see `piece`).

Each piece is minimized once per run (the sentinel keeps the first mismatching call); its minimal script and inputs
become files of the dump next to the piece's other scripts, and its record gets `minimized` (`records.Minimized`).
A piece whose child dies or runs past its budget gets that as its note.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import tempfile
from pathlib import Path
from typing import Any

from thunderfx_debug.records import layout
from thunderfx_debug.artifacts.artifact import Artifact, ArtifactSettings
from thunderfx_debug.artifacts.repro import fx_facts, writers
from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.minimize import flush_child
from thunderfx_debug.minimize.piece import Reduction
from thunderfx_debug.minimize.statements import PieceCode, split_source
from thunderfx_debug.minimize.writing import PieceSpec, ThroughThunder
from thunderfx_debug.artifacts.repro.builder import run_failure_argument
from thunderfx_debug.records import InputKind, Minimized, SplitKind
from thunderfx_debug.recording.recorder import GraphSnapshot, SplitSnapshot
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import minimized
from thunderfx_debug.render.progress import announce
from thunderfx_debug.render.text import plural
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import options as thunder_options
from thunderfx_debug.thunder import scripts as thunder_scripts

log = logging.getLogger("thunderfx_debug")


@dataclasses.dataclass(frozen=True)
class RaisedCall:
    """The call of a split that raised in the run, as the minimizer takes it (in place of the sentinel's evidence
    of a mismatching call): its number, phase, and the inputs kept of it (real copies with INPUTS=real)."""

    call: int
    phase: str
    captured: Any = None


@dataclasses.dataclass(frozen=True)
class MinimizeSettings:
    enabled: bool = False
    budget_s: float = 120.0


def _inputs_of(captured, metas, names) -> flush_child.PieceValues:
    """How the piece's child makes its inputs: the host copies the sentinel kept of the mismatching call, else the
    metadata (a kind of input with no metadata cannot be rebuilt)."""
    if captured is not None and captured.inputs is not None:
        return flush_child.PieceValues(copies=list(captured.inputs))
    for i, meta in enumerate(metas):
        if meta.kind is InputKind.OTHER:
            raise ValueError(f"input {i} ({meta.value}) cannot be rebuilt from its metadata")
    return flush_child.PieceValues(metas=tuple(metas), names=tuple(names),
                                   integers=repro_inputs.run_integers(captured, metas))


class Minimizer:
    """The flush-time minimization of one run's flagged pieces, each done once (see the module docstring)."""

    def __init__(self, settings: MinimizeSettings | None = None):
        self.settings = settings or MinimizeSettings()
        # piece key -> (the evidence it was minimized from, kept alive so that its id stays its own; the reduction
        # as a record; its files)
        self._done: dict[str, tuple[Any, Minimized, list[Artifact]]] = {}
        self.announced_s: float | None = None  # what the last minimization said beforehand it would take at most

    @property
    def reductions(self) -> dict[str, Minimized]:
        """Piece key -> its reduction, for the pieces minimized so far."""
        return {key: record for key, (_, record, _) in self._done.items()}

    def artifacts(self) -> list[Artifact]:
        return [artifact for _, _, files in self._done.values() for artifact in files]

    def minimize(self, snapshots: list[GraphSnapshot], settings: ArtifactSettings,
                 failures: ReportingFailures) -> None:
        """Minimizes the flagged pieces of `snapshots` not minimized yet."""
        if not self.settings.enabled:
            return
        pending = []
        for snapshot in snapshots:
            graph = snapshot.state.name
            for split in snapshot.splits:
                key = PieceKey.of(graph, split.state.name)
                tally = split.state.check
                if tally is not None and tally.evidence is not None and key not in self._done:
                    pending.append((key, snapshot, split, None, tally.evidence))
                for region in split.regions:
                    region_tally = split.state.region_checks.get(region.key)
                    owner = key.region(region.key)
                    if region_tally is not None and region_tally.evidence is not None and owner not in self._done:
                        pending.append((owner, snapshot, split, region, region_tally.evidence))
            raised = _raised_call(snapshot, settings)
            if raised is not None and raised[0] not in self._done and all(p[0] != raised[0] for p in pending):
                pending.append(raised)
        if not pending:
            return
        self.announced_s = len(pending) * self.settings.budget_s
        announce(f"thunderfx_debug: the flush minimizes {plural(len(pending), 'piece')} the correctness check "
                 f"flagged, in processes of their own, each within THUNDERFX_DEBUG_MINIMIZE_BUDGET="
                 f"{self.settings.budget_s:g} s: at most about {self.announced_s:.0f} s; training waits meanwhile "
                 "(THUNDERFX_DEBUG_MINIMIZE=0 skips it; `thunderfx-debug minimize SCRIPT` does it later)")
        for key, snapshot, split, region, evidence in pending:
            log.info("thunderfx_debug: minimizing %s (budget %g s)", key, self.settings.budget_s)
            record, files = Minimized(ops_before=0, note="could not be minimized (see the reporting failures)"), []
            with failures.guard(f"minimizing {key}"):
                record, files = self._piece(snapshot, split, region, evidence, settings)
            self._done[key] = (evidence, record, files)
            log.info("thunderfx_debug: %s", minimized.line(minimized.MinimizedPiece(key, record)))

    def _piece(self, snapshot: GraphSnapshot, split: SplitSnapshot, region, evidence,
               settings: ArtifactSettings) -> tuple[Minimized, list[Artifact]]:
        graph, split_name = snapshot.state.name, split.state.name
        if region is None:
            spec, code, prelude, inputs = self._split(snapshot, split, evidence, settings)
            folder = layout.split_dir(graph, split_name)
        else:
            spec, code, prelude, inputs = self._region(split, region, evidence, graph)
            folder = layout.fusions_dir(graph, split_name)
        from thunderfx_debug.artifacts.repro.builder import versions_line

        with tempfile.TemporaryDirectory(prefix="thunderfx_debug_minimize_") as out:
            job = flush_child.MinimizeJob(spec, code, prelude, inputs, self.settings.budget_s, versions_line())
            reduction, written = flush_child.minimized_in_a_child(job, Path(out))
        files = []
        if reduction.script is not None:
            owner = spec.key
            (script_name, script_text), (inputs_name, inputs_bytes) = written
            files.append(Artifact(owner, f"minimal_repro_{Path(script_name).stem.rpartition('_')[2]}",
                                  posixpath.join(folder, script_name), script_text))
            files.append(Artifact(owner, "minimal_inputs", posixpath.join(folder, inputs_name), inputs_bytes))
        script = files[0].path if files else None
        return record_of(reduction, script), files

    @staticmethod
    def _split(snapshot: GraphSnapshot, split: SplitSnapshot, evidence, settings: ArtifactSettings):
        graph, name = snapshot.state.name, split.state.name
        module = split.state.split.original_module
        metas = repro_inputs.split_metas(snapshot, split)
        raised = isinstance(evidence, RaisedCall)
        if raised and evidence.captured is not None:
            metas = evidence.captured.metas(wait=True) or metas
        source = thunder_scripts.module_source(module, writers.MODULE_CLASS)
        code = PieceCode.parse(source, writers.MODULE_CLASS)
        prelude = "\n".join(thunder_scripts.fx_builtin_imports())
        options = dict(settings.thunder_options)
        strategy = writers.ThunderJit(options, thunder_options.executor_names(options),
                                      thunder_options.run_executor_modules(options), as_split=True)
        real = evidence.captured is not None and evidence.captured.inputs is not None
        spec = PieceSpec(
            key=PieceKey.of(graph, name), stem=layout.split_prefix(graph, name),
            title=f"{split.state.split.kind.value} split", file_kind="thunder", strategy=strategy,
            prelude=prelude, backward=any(m.kind is InputKind.TENSOR and m.requires_grad for m in metas),
            random_ops=fx_facts.random_ops(module),
            origin=f"the run, call {evidence.call} ({evidence.phase})" + (", where it raised" if raised else ""),
            run_failure=run_failure_argument(snapshot.state, real) if raised else None)
        return spec, code, prelude, _inputs_of(evidence.captured, metas, split.state.split.input_names)

    @staticmethod
    def _region(split: SplitSnapshot, region, evidence, graph: str):
        # torch's draws: the ops are handed back to Thunder (or inductor), which would trace nvFuser's draws as ops
        source, ctx = thunder_scripts.region_torch_function(region.bsym, region.name, draws="torch")
        assignments, needs_thunder = writers.context_assignments(source, ctx, thunder_scripts.region_helpers(ctx))
        around, function = split_source(source, region.name)
        around = "\n".join(line for line in around.splitlines() if not line.startswith("# Constructed by"))
        prelude = "\n".join([*assignments, around])
        code = PieceCode.parse(function, region.name)
        executor = region.executor
        if executor.startswith("torchcompile"):  # Thunder's torch.compile executors: torch.compile of the ops
            strategy, file_kind = writers.InductorRegion(), "inductor"
        else:
            strategy, file_kind = ThroughThunder(executor), "thunder"
        spec = PieceSpec(
            key=PieceKey.of(graph, split.state.name, region.key),
            stem=layout.fusion_prefix(graph, split.state.name, region.name, region.phase.value),
            title=f"{region.phase.value} fusion region {region.name} ({executor})", file_kind=file_kind,
            strategy=strategy, prelude=prelude, backward=False,
            random_ops=thunder_scripts.region_random_ops(region.bsym), needs_thunder=needs_thunder,
            origin=f"the run, call {evidence.call} ({evidence.phase})",
            executor="nvfuser" if executor == "nvfuser" else "")
        metas = tuple(dataclasses.replace(m, requires_grad=False) for m in repro_inputs.region_metas(split, region))
        return spec, code, prelude, _inputs_of(evidence.captured, metas, region.inputs)


def _raised_call(snapshot: GraphSnapshot, settings: ArtifactSettings):
    """The minimizer's entry for the Thunder split of `snapshot` that raised in the run (forward or backward),
    None where none did."""
    failure = snapshot.state.failure
    split = next((s for s in snapshot.splits if failure is not None and s.state.name == failure.split), None)
    if split is None or split.state.split.kind is not SplitKind.THUNDER:
        return None
    where = failure.where
    captured = where.captured if where.captured is not None else split.state.captured
    if not settings.real_inputs and captured is not None:
        captured = dataclasses.replace(captured, inputs=None)  # metadata only, as its repro scripts have it
    call = RaisedCall(where.call, where.failed_in.value, captured)
    return PieceKey.of(snapshot.state.name, split.state.name), snapshot, split, None, call


def record_of(reduction: Reduction, script: str | None) -> Minimized:
    """The dump's record of `reduction`, whose minimal script was written to `script` (None: nothing was written,
    and no figure after the cut is kept)."""
    shared = {f.name: getattr(reduction, f.name) for f in dataclasses.fields(Minimized) if f.name != "script"}
    if script is None:
        shared.update(ops_after=None, inputs_after=None, outputs_after=None)
    return Minimized(**shared, script=script)
