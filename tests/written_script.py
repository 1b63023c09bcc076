"""A repro script as the writers write every one, without a training run, for the tests that hold the package's bottom
layer (`thunderfx_debug/scripts/`: the judging rule, the device timer) against what a script carries: a one-op piece
(`double`) written with a strategy of the test's choosing, its file, and the namespace the script's own text defines
(run under another name than `__main__`, so that its `main` does not run).

    script = write(tmp_path, Scaled(1.001))   # a backend 0.1 % off: its script says MISMATCH
    SCRIPT = namespace()                       # the rule and the timer as a written script defines them
"""

from __future__ import annotations

import functools
import types
from pathlib import Path

from thunderfx_debug.artifacts.repro import writers
from thunderfx_debug.records import InputMeta

#: The file name under which `namespace` compiles the script's text (its functions' `co_filename`).
FILE_NAME = "graph0_repro_eager.py"


class Scaled(writers.Strategy):
    """A stand-in backend: eager's outputs times `factor` (1: exactly eager's)."""

    executor = file_kind = "scaled"
    backend = "a scaled eager"
    description = "eager PyTorch, its outputs scaled"

    def __init__(self, factor: float):
        self.factor = factor

    def build_body(self, piece: writers.ReproSubject) -> str:
        return f"return lambda *args: tuple(y * {self.factor!r} for y in {piece.instance()}(*args))"


def piece() -> writers.ReproSubject:
    """A Dynamo graph of one op that doubles a float32 vector, its input drawn from the run's metadata."""
    x = InputMeta(kind="tensor", shape=(64,), stride=(1,), dtype="torch.float32", device="cpu", min_value=-1.0,
                  max_value=1.0)
    return writers.ReproSubject(key="graph0", title="Dynamo graph graph0", description="A one-op piece of a test.",
                                definitions="def double(x):\n    return (x * 2,)", callable_name="double",
                                is_module=False, metas=(x,), names=("x",), backward=True)


def text(strategy: writers.Strategy | None = None) -> str:
    strategy = strategy or writers.Eager()
    return writers.render(piece(), strategy, f"graph0/graph0_repro_{strategy.file_kind}.py", "a test's")


def write(directory: Path, strategy: writers.Strategy | None = None) -> Path:
    """The script of `piece` with `strategy` (eager without), written into `directory`."""
    strategy = strategy or writers.Eager()
    path = directory / f"graph0_repro_{strategy.file_kind}.py"
    path.write_text(text(strategy))
    return path


@functools.cache
def namespace() -> types.SimpleNamespace:
    """What the text of the eager script defines: its judging rule, timer, check and `main`, compiled from the
    script's own text (the package's modules are not what runs)."""
    defined: dict = {"__name__": "written_script"}
    exec(compile(text(), FILE_NAME, "exec"), defined)
    return types.SimpleNamespace(**defined)
