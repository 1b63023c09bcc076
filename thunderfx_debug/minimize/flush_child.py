"""The process a flagged piece is minimized in at flush (`at_flush`): it makes the piece's inputs, runs the piece
eagerly for the values its cuts hand on (`shrink.full_values`), and shrinks it (`piece.minimize_piece`), its trials
in children of its own; the training process only writes the job and reads back the minimal script.

    python -m thunderfx_debug.minimize.flush_child FOLDER

The job is a pickle the training process wrote for its own child into a private temporary folder (never a dump's
file); the child writes `result.pkl` next to it: the reduction, and the minimal script and inputs file as
(name, content) pairs. A child that dies or runs past its time limit leaves no result: the piece's note says how it
ended.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from thunderfx_debug.minimize.piece import Reduction
from thunderfx_debug.minimize.statements import PieceCode
from thunderfx_debug.minimize.trials import TRIAL_TIMEOUT_S
from thunderfx_debug.minimize.writing import PieceSpec

JOB, RESULT, LOG = "job.pkl", "result.pkl", "minimize.log"
#: Beyond its budget, what a piece's child may take: the full piece's runs before shrinking, and the minimal
#: script's run after it, each a trial of its own.
SLACK_S = 3 * TRIAL_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class PieceValues:
    """How the child makes the piece's inputs: host copies of the recorded call's (`recording.capture`'s format), or
    the metadata the repro scripts rebuild inputs from, with the run's integer and bool inputs."""

    copies: list[Any] | None = None
    metas: tuple[Any, ...] = ()
    names: tuple[str, ...] = ()
    integers: dict[int, Any] = dataclasses.field(default_factory=dict)  # the run's integer and bool inputs


@dataclasses.dataclass(frozen=True)
class MinimizeJob:
    spec: PieceSpec
    code: PieceCode
    prelude: str
    inputs: PieceValues
    budget_s: float
    versions: str


def minimized_in_a_child(job: MinimizeJob, folder: Path) -> tuple[Reduction, tuple | None]:
    """Minimizes `job` in a child process (a fork where this process has not initialised CUDA, else a fresh
    interpreter); (the reduction, ((script name, text), (inputs name, bytes)) or None)."""
    from thunderfx_debug.children import forks, pool, protocol

    (folder / JOB).write_bytes(pickle.dumps(job))
    limit = job.budget_s + SLACK_S
    log = folder / LOG
    if forks.can_fork():
        status = forks.forked(forks.run_function,
                              ("thunderfx_debug.minimize.flush_child:run", str(log), [folder]), limit)
    else:
        status = pool.run_process([sys.executable, "-m", "thunderfx_debug.minimize.flush_child", str(folder)],
                                  log, dict(os.environ), limit)
    result = folder / RESULT
    if status == 0 and result.exists():
        content = pickle.loads(result.read_bytes())  # noqa: S301 (our own child's file, in our own private folder)
        return content["reduction"], content["written"]
    how = protocol.how_it_ended(status, limit)
    tail = log.read_text(errors="replace").strip().splitlines()[-15:] if log.exists() else []
    note = f"the process that minimized it {how}" + (": " + " | ".join(tail) if tail else "")
    return Reduction(job.spec.key, len(job.code.ops), inputs_before=len(job.code.params),
                     outputs_before=len(job.code.outputs), note=note), None


def _namespace(prelude: str) -> dict[str, Any]:
    """Where the piece's code runs here: what a script that needs Thunder has (`script_support`), then the piece's
    own prelude (imports, the torch executor's helpers)."""
    import torch

    from thunderfx_debug.thunder import script_support

    namespace: dict[str, Any] = {name: getattr(script_support, name) for name in dir(script_support)
                                 if not name.startswith("__")}
    namespace.update(torch=torch, __name__="thunderfx_debug_minimize")
    exec(compile(prelude, "<thunderfx_debug minimize: prelude>", "exec"), namespace)  # noqa: S102 (our own code)
    return namespace


def made_inputs(values: PieceValues) -> list[Any]:
    from thunderfx_debug.artifacts.repro import script_template
    from thunderfx_debug.triage.piece_inputs import rebuilt_inputs

    if values.copies is not None:
        return [script_template._rebuild(x) for x in values.copies]
    made = list(rebuilt_inputs(values.metas, values.names))
    for i, saved in values.integers.items():  # as the repro scripts take them: they index, select and mask
        made[i] = script_template._rebuild(saved)
    return made


def run(folder: Path) -> None:
    """Minimizes the job in `folder` and writes `result.pkl` (see the module docstring)."""
    import torch

    from thunderfx_debug.minimize.piece import minimize_piece
    from thunderfx_debug.minimize.shrink import full_values
    from thunderfx_debug.minimize.trials import TrialRunner

    job: MinimizeJob = pickle.loads((folder / JOB).read_bytes())  # noqa: S301 (our parent's file, our folder)
    inputs = made_inputs(job.inputs)
    devices = sorted({v.device.index for v in inputs if isinstance(v, torch.Tensor) and v.is_cuda
                      and v.device.index is not None})
    with torch.random.fork_rng(devices=devices):
        values = full_values(job.code, _namespace(job.prelude), inputs, grad=job.spec.backward)
    with tempfile.TemporaryDirectory(prefix="thunderfx_debug_minimal_") as out, TrialRunner.in_this_process() as runner:
        reduction = minimize_piece(job.spec, job.code, values, runner, job.budget_s, Path(out), job.versions)
        written = None
        if reduction.script is not None:
            written = ((reduction.script.name, reduction.script.read_text()),
                       (reduction.inputs_file.name, reduction.inputs_file.read_bytes()))
    (folder / RESULT).write_bytes(pickle.dumps({"reduction": reduction, "written": written}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m thunderfx_debug.minimize.flush_child FOLDER")
    run(Path(sys.argv[1]))
