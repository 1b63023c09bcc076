"""Running repro scripts as their users will: each in a fresh interpreter in which thunderfx_debug cannot be imported
(a finder first on `sys.meta_path` refuses it, whatever else the environment installs), in the script's folder.
Tests and benchmarks use this to prove that the scripts stand on their own, and `verify` and `bench` to run alone a
script that took its worker down. `pool`'s workers refuse the package with the same finder
(`REFUSE_THUNDERFX_DEBUG`).

    run = run_script(Path("dump/rank0/graph0/graph0_repro_thunder.py"))
    run.outcome        # "OK", "MISMATCH", "REFUSED", "CRASH", "NOT_COMPARABLE", "NOT_REBUILT",
                       # or "KILLED" / "TIMEOUT" / "NO_RESULT"
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from thunderfx_debug.children.protocol import end_group
from thunderfx_debug.scripts.result_line import last_result, outcome_of

#: Python code (after `import sys`) that makes thunderfx_debug unimportable: a finder first on `sys.meta_path`.
REFUSE_THUNDERFX_DEBUG = r"""
class RefuseThunderfxDebug:
    def find_spec(self, name, path=None, target=None):
        if name == "thunderfx_debug" or name.startswith("thunderfx_debug."):
            raise ModuleNotFoundError(f"No module named {name!r} (repro scripts must run without thunderfx_debug)")
        return None
sys.meta_path.insert(0, RefuseThunderfxDebug())
"""

#: Runs argv[1] as __main__ with the rest as its arguments, thunderfx_debug unimportable.
LAUNCHER = r"""
import runpy, sys
""" + REFUSE_THUNDERFX_DEBUG + r"""
assert "thunderfx_debug" not in sys.modules
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """One run of a script: `outcome` from its RESULT line (KILLED: ended by a signal, e.g. a native abort;
    TIMEOUT; NO_RESULT: it exited without a RESULT line), exit status, wall seconds, and what it printed."""

    script: str
    outcome: str
    returncode: int | None
    wall_s: float
    stdout: str
    stderr: str

    @property
    def result_line(self) -> str:
        found = last_result(self.stdout)
        return found.line if found is not None else ""


def command(script: Path, args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """The command line that runs `script` where thunderfx_debug cannot be imported."""
    return [python, "-c", LAUNCHER, str(script), *args]


def run_script(script: Path, args: Sequence[str] = (), timeout_s: float = 600, env: dict[str, str] | None = None,
               python: str = sys.executable) -> ScriptRun:
    """Runs `script` (in its own folder) where thunderfx_debug cannot be imported; never raises for the script's
    own failures. Past `timeout_s` it is ended with what it started (its process group: inductor's compile workers,
    a script's own children), which `subprocess.run`'s timeout would leave running."""
    started = time.perf_counter()
    process = subprocess.Popen(command(script.resolve(), args, python), cwd=script.parent, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                               env=env if env is not None else dict(os.environ), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        returncode = process.returncode
    except subprocess.TimeoutExpired:
        end_group(process.pid)
        stdout, stderr = process.communicate()
        returncode = None
    return ScriptRun(str(script), outcome_of(returncode, stdout), returncode, time.perf_counter() - started,
                     stdout, stderr)
