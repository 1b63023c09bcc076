"""Running trials: each script in a child process of its own, so that a crash, a native abort or a device assert
is the trial's verdict and not the end of the minimizer; each with a time limit; all of a piece's within its budget.

Two ways to get a child, both by `os.fork` (not `multiprocessing`, whose children import the parent's `__main__`
again: a training script without a `__main__` guard would train again in every trial):
- "fork" (`TrialRunner.in_this_process()` where it may): a copy of the calling process. At flush, in the training
  process, the child has the run's Thunder, its executors (a custom executor registered by the training script is
  found by name) and its imported modules. A process that has initialised CUDA cannot fork a child that uses it, so
  there the other way is taken (`children.forks.can_fork` decides).
- "server": a fresh interpreter that imports torch (and Thunder, where there is no GPU) once and forks each trial
  from itself, initialising no CUDA (`children.fork_server`): what the command line uses. Its children see the
  environment the command was started with.

Example (the budget, with a fake clock):
    >>> clock = iter([0.0, 10.0, 130.0]).__next__
    >>> budget = Budget(120.0, clock)
    >>> budget.left(), budget.spent()
    (110.0, True)
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from thunderfx_debug.children import forks
from thunderfx_debug.children.fork_server import ForkServer
from thunderfx_debug.minimize.verdict import ScriptVerdict, read_run

#: Seconds a single run of a script may take before it is stopped (a compile on the H200 takes tens of seconds).
TRIAL_TIMEOUT_S = 600.0
#: Least time a trial gets when the budget is nearly spent (less would stop trials that would have answered).
MIN_TRIAL_S = 30.0


class Budget:
    """Seconds of minimizing a piece may take, counted from its creation on `clock` (time.monotonic)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self._clock = seconds, clock
        self._started = clock()

    def elapsed(self) -> float:
        return self._clock() - self._started

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def spent(self) -> bool:
        return self.left() <= 0


class BudgetSpent(Exception):
    """The piece's time is up: the minimizer keeps the smallest failing piece found so far."""


class TrialRunner:
    """Runs scripts in child processes (see the module docstring); `method` "fork" or "server". Close it (or use
    it as a context manager) to end its server."""

    def __init__(self, method: str = "server"):
        if method not in ("fork", "server"):
            raise ValueError(f"method {method!r}: allowed: fork, server")
        self.method = method
        self._server = ForkServer()

    @classmethod
    def in_this_process(cls) -> TrialRunner:
        """Children that are copies of this process where it can fork them (`forks.can_fork`), else children of a
        fresh server."""
        return cls("fork" if forks.can_fork() else "server")

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._server.close()

    def _run(self, target, args, timeout_s: float) -> tuple[int | None, float]:
        started = time.perf_counter()
        forked = forks.forked if self.method == "fork" else self._server.forked
        returncode = forked(target, args, timeout_s)
        return returncode, time.perf_counter() - started

    def run(self, script: Path, timeout_s: float = TRIAL_TIMEOUT_S, argv: Sequence[str] = ()) -> ScriptVerdict:
        """Runs `script` as `python script.py` would, in its folder; its verdict (see `verdict.read_run`)."""
        script = script.resolve()
        with tempfile.NamedTemporaryFile("w+", prefix="thunderfx_debug_trial_", suffix=".log") as log:
            returncode, seconds = self._run(forks.run_script, (str(script), log.name, list(argv)), timeout_s)
            output = Path(log.name).read_text(errors="replace")
        return read_run(returncode, output, seconds)

    def call(self, target: str, args: Sequence, timeout_s: float = TRIAL_TIMEOUT_S) -> tuple[bool, str]:
        """Calls `module:function(*args)` in a child; (whether it returned, what it printed)."""
        with tempfile.NamedTemporaryFile("w+", prefix="thunderfx_debug_step_", suffix=".log") as log:
            returncode, _ = self._run(forks.run_function, (target, log.name, list(args)), timeout_s)
            output = Path(log.name).read_text(errors="replace")
        return returncode == 0, output
