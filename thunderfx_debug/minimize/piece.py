"""Minimizing one piece, from its full code to its minimal script: what the command line and the flush share.

`minimize_piece` runs the full piece (as trials do: a script in a child process) until its verdict is known and
stable, refuses a piece that does not fail or fails at random, shrinks it (`shrink.Cuts`) within its budget, writes
`<stem>_minimal_repro_<backend>.py` with its inputs next to it, and runs that script once more. For an nvFuser
region, whose trials hand the region's ops back to Thunder with nvFuser, the minimal script is nvFuser's own
definition of the minimal region (no Thunder in it) where Thunder fuses the minimal ops into one region and that
script fails the same way; else it stays the Thunder one, and its header says why.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from thunderfx_debug.artifacts.repro import writers
from thunderfx_debug.minimize import writing
from thunderfx_debug.minimize.shrink import Cuts
from thunderfx_debug.minimize.statements import PieceCode
from thunderfx_debug.minimize.trials import MIN_TRIAL_S, TRIAL_TIMEOUT_S, Budget, BudgetSpent, TrialRunner
from thunderfx_debug.minimize.verdict import ScriptVerdict
from thunderfx_debug.minimize.writing import Cut, PieceSpec

#: Runs of the full piece before shrinking: a verdict that changes between them is random.
FULL_RUNS = 2


@dataclasses.dataclass(frozen=True)
class Reduction:
    """What minimizing a piece did. `script` is None where nothing was written (`note` says why: the piece does not
    fail, fails at random, ...). `verdict` is the full piece's RESULT line, `final` the minimal script's."""

    key: str
    ops_before: int
    ops_after: int | None = None
    inputs_before: int = 0
    inputs_after: int | None = None
    outputs_before: int = 0
    outputs_after: int | None = None
    trials: int = 0
    seconds: float = 0.0
    verdict: str = ""
    final: str = ""
    script: Path | None = None
    inputs_file: Path | None = None
    kept: tuple[str, ...] = ()
    budget_spent: bool = False
    note: str = ""

    @property
    def minimized(self) -> bool:
        return self.script is not None


class NotMinimized(Exception):
    """The piece cannot be shrunk; the message says why and what to do."""


def minimal_name(stem: str, file_kind: str) -> str:
    """"graph0_thunder_0" -> "graph0_thunder_0_minimal_repro_thunder" (no suffix)."""
    return f"{stem}_minimal_repro_{file_kind}"


def minimize_piece(spec: PieceSpec, code: PieceCode, values: Mapping[str, Any], runner: TrialRunner,
                   budget_s: float, out_dir: Path, versions: str,
                   script_runs: Sequence[ScriptVerdict] = (), out_name: str | None = None) -> Reduction:
    """Shrinks the piece and writes its minimal script into `out_dir` (as `out_name`.py, default
    `minimal_name(spec.stem, <backend>)`). `values` holds every value the full piece computes
    (`shrink.full_values`). `script_runs`: the runs of the script the piece came from, which fail the same way
    each time (the caller checked) and which the piece must reproduce; without them, the full piece runs
    `FULL_RUNS` times and must fail the same way each time. Every run counts as a trial."""
    started = time.monotonic()
    budget = Budget(budget_s)
    cuts = Cuts(code, values)
    base = Reduction(spec.key, len(code.ops), inputs_before=len(code.params), outputs_before=len(code.outputs))
    work = Path(tempfile.mkdtemp(prefix="thunderfx_debug_minimize_"))
    runs = len(script_runs)
    reference = script_runs[0] if script_runs else None
    try:
        def run(cut: Cut, name: str, timeout_s: float = TRIAL_TIMEOUT_S) -> ScriptVerdict:
            nonlocal runs
            description = (f"A trial of thunderfx_debug's minimizer: {len(cut.kept)} of the {len(code.ops)} ops of "
                           f"{spec.key}.")
            script, _ = writing.write(spec, code, cut, values, work, name, description, versions)
            runs += 1
            return runner.run(script, timeout_s)

        full = [run(cuts.full, "full_piece") for _ in range(1 if reference is not None else FULL_RUNS)]
        _check_full(spec, reference, full)
        reference = reference or full[0]

        def fails(cut: Cut) -> bool:
            if budget.spent():
                raise BudgetSpent
            verdict = run(cut, f"trial_{runs}", max(min(TRIAL_TIMEOUT_S, budget.left()), MIN_TRIAL_S))
            return reference.same_failure_as(verdict)

        best, _ = cuts.shrink(fails)
        spent = budget.spent()
        shrink_s = time.monotonic() - started
        name = out_name or minimal_name(spec.stem, spec.file_kind)
        out_dir.mkdir(parents=True, exist_ok=True)
        strategy, final_cut, note = spec.strategy, best, ""
        if spec.executor == "nvfuser":
            strategy, final_cut, note = _as_nvfuser(spec, code, best, values, runner, work, versions)
            if strategy is not spec.strategy and out_name is None:
                name = minimal_name(spec.stem, "nvfuser")
        reduction = dataclasses.replace(
            base, ops_after=len(best.kept), inputs_after=len(best.inputs), outputs_after=len(best.outputs),
            trials=runs, seconds=round(shrink_s, 1), verdict=reference.line or reference.describe(),
            kept=tuple(code.ops[i].label for i in best.kept), budget_spent=spent, note=note)
        script, inputs_file = _write_minimal(spec, code, final_cut, values, out_dir, name, versions, strategy,
                                             reduction, budget_s)
        final = runner.run(script)
        if strategy is not spec.strategy and not reference.same_failure_as(final):
            # nvFuser's definition alone does not fail as the piece did: keep the Thunder script instead
            note = (f"nvFuser's definition of the minimal region alone said {final.describe()}, so this script "
                    "runs the region's ops through Thunder with nvFuser")
            script.unlink()
            inputs_file.unlink()
            strategy = spec.strategy
            name = out_name or minimal_name(spec.stem, spec.file_kind)
            reduction = dataclasses.replace(reduction, note=note)
            script, inputs_file = _write_minimal(spec, code, best, values, out_dir, name, versions, strategy,
                                                 reduction, budget_s)
            final = runner.run(script)
        if not reference.same_failure_as(final):
            reduction = dataclasses.replace(
                reduction, note=(reduction.note + "; " if reduction.note else "")
                + f"run once more, the minimal script said {final.describe()}: the failure may depend on more than "
                  "its ops")
        return dataclasses.replace(reduction, script=script, inputs_file=inputs_file,
                                   final=final.line or final.describe())
    except NotMinimized as e:
        return dataclasses.replace(base, trials=runs, seconds=round(time.monotonic() - started, 1), note=str(e),
                                   verdict=(reference.line or reference.describe()) if reference else "")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_full(spec: PieceSpec, reference: ScriptVerdict | None, full: Sequence[ScriptVerdict]) -> None:
    """Raises NotMinimized unless the full piece fails, every run of it the same way (as the script's own runs,
    `reference`, where it came from a script)."""
    if reference is not None:
        if not reference.same_failure_as(full[0]):
            raise NotMinimized(
                f"the piece as thunderfx_debug rebuilds it from {spec.origin} said {full[0].describe()}, the script "
                f"itself {reference.describe()}: it cannot be shrunk from this script (please report this, with the "
                "script, as a bug of thunderfx_debug)")
        return
    if any(run.failing for run in full) and not all(full[0].same_failure_as(run) for run in full[1:]):
        seen = "; ".join(dict.fromkeys(run.describe() for run in full))
        raise NotMinimized(f"{spec.key} fails at random: identical runs of it said {seen}; a random failure cannot "
                           "be shrunk (each cut would be judged by chance): report it with its script as it is")
    if "is not registered here" in full[0].line:
        raise NotMinimized(f"the trials of {spec.key} cannot build it ({full[0].line.split(': ', 1)[-1]}): they run "
                           "in a fresh process (this one has initialised CUDA), where only executors registered by "
                           "an import are found")
    if not full[0].failing:
        script = "script" if spec.run_failure is not None else "mismatch script"
        raise NotMinimized(f"{spec.key} does not fail outside the training process ({full[0].describe()}): "
                           f"nothing to minimize; its {script} holds what the run saw")


def _description(spec: PieceSpec, code: PieceCode, reduction: Reduction, cut: Cut, inputs_name: str,
                 budget_s: float) -> str:
    cut_inputs = [name for name in cut.inputs if name not in code.params]
    stopped = f", stopped by its budget of {budget_s:g} s" if reduction.budget_spent else ""
    lines = [
        f"Minimized by thunderfx_debug from {spec.origin or spec.key}: {reduction.ops_before} ops -> "
        f"{reduction.ops_after} op{'s' if reduction.ops_after != 1 else ''}, inputs {reduction.inputs_before} -> "
        f"{reduction.inputs_after}, outputs {reduction.outputs_before} -> {reduction.outputs_after}; "
        f"{reduction.trials} trials (each a run of a cut of the piece in a child process), {reduction.seconds:g} s"
        f"{stopped}.",
        f"The full piece: {reduction.verdict}",
        "Kept: " + "; ".join(reduction.kept),
    ]
    if cut_inputs:
        lines.append(f"Cut: the other {reduction.ops_before - (reduction.ops_after or 0)} ops. The values the ops "
                     f"before the kept ones computed in the full piece (eager) are inputs here: "
                     f"{', '.join(cut_inputs)}, saved in {inputs_name}.")
    else:
        lines.append(f"Cut: the other {reduction.ops_before - (reduction.ops_after or 0)} ops.")
    if reduction.note:
        lines.append(f"Note: {reduction.note}.")
    return "\n".join(lines)


def _write_minimal(spec: PieceSpec, code: PieceCode, cut: Cut, values: Mapping[str, Any], out_dir: Path, name: str,
                   versions: str, strategy: writers.Strategy, reduction: Reduction,
                   budget_s: float) -> tuple[Path, Path]:
    inputs_name = f"{name}_inputs.pt"
    description = _description(spec, code, reduction, cut, inputs_name, budget_s)
    title = f"minimal repro of the {spec.title}"
    script, inputs_file = writing.write(spec, code, cut, values, out_dir, name, description, versions, strategy,
                                        title)
    # The writers say where a dump's inputs came from; here they are what the kept ops read.
    text = re.sub(r"^Inputs: .*?(?=\n(Random ops|\"\"\"))",
                  "Inputs: what the kept ops read, loaded from the file next to this script (torch.load, "
                  f"weights_only=True): {inputs_name}", script.read_text(), count=1, flags=re.S | re.M)
    text = re.sub(r"^# The values of the run's first call of this piece.*?\n(?=INPUTS_FILE)",
                  "# What the kept ops read (torch.load with weights_only=True).\n", text, count=1, flags=re.S | re.M)
    script.write_text(text)
    return script, inputs_file


def _as_nvfuser(spec: PieceSpec, code: PieceCode, cut: Cut, values: Mapping[str, Any], runner: TrialRunner,
                work: Path, versions: str) -> tuple[writers.Strategy, Cut, str]:
    """nvFuser's own script of the minimal region (see the module docstring): (its strategy, the cut with its
    inputs and outputs in the order of nvFuser's definition, ""), or (the trials' strategy, `cut`, why not)."""
    script, _ = writing.write(spec, code, cut, values, work, "handed_back", "nvFuser's definition of a cut", versions)
    answer = work / "handed_back.json"
    done, output = runner.call("thunderfx_debug.minimize.piece:nvfuser_definition", [str(script), str(answer)])
    found = json.loads(answer.read_text()) if done and answer.exists() else {"error": output.strip()[-300:]}
    if "error" in found:
        return spec.strategy, cut, f"nvFuser's definition of the minimal region could not be had ({found['error']})"
    inputs = tuple(cut.inputs[i] for i in found["inputs"])
    outputs = tuple(cut.outputs[i] for i in found["outputs"])
    return writers.NvFuserRegion(found["definition"]), Cut(cut.kept, outputs, inputs), ""


def nvfuser_definition(script: str, answer: str) -> None:
    """In a trial's child: runs the piece of `script` (a Thunder trial of a region's ops with nvFuser) once and
    writes to `answer` (JSON) nvFuser's repro of the one fusion region Thunder made, with the positions of its
    inputs and outputs among the piece's, or {"error": why}."""
    import runpy

    import torch

    from thunderfx_debug.thunder.handback import single_fusion
    from thunderfx_debug.thunder.scripts import nvfuser_repro_source

    try:
        namespace = runpy.run_path(script, run_name="thunderfx_debug_minimize")
        torch.manual_seed(namespace["SEED"])
        inputs = namespace["make_inputs"]()
        jitted = namespace["build"]()
        with torch.no_grad():
            jitted(*namespace["fresh"](inputs))
        found = single_fusion(jitted)
        result: dict[str, Any] = {"definition": nvfuser_repro_source(found.bsym),
                                  "inputs": list(found.input_positions), "outputs": list(found.output_positions)}
    except Exception as e:
        result = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    Path(answer).write_text(json.dumps(result))
