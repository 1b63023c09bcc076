"""`thunderfx-debug bench` in long-lived workers (`children.pool`, which `verify` uses too): one per GPU, each running
the dump's scripts one after another with `--benchmark --json PATH`, so that Python, torch, Thunder and nvFuser
start once and inductor's and Triton's in-memory caches carry over from script to script.

A script that takes its worker down runs alone in its own process (`bench.run_script`, which records the crash as
that script's result), and a new worker carries on with the rest. What each script printed is in the results
directory beside its JSON (`<script>.log`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from thunderfx_debug.commands import bench
from thunderfx_debug.children.pool import Finished, Job, run_jobs
from thunderfx_debug.children.protocol import how_it_ended


def run_in_one_process(rank_dir: Path, scripts: Sequence[str], results_dir: Path, timeout_s: float,
                       python: str = sys.executable, device: str | None = None,
                       on_done: Callable[[str, bench.ScriptResult], None] | None = None) -> dict[str, bench.ScriptResult]:
    """Each script's result (scripts relative to `rank_dir`), measured in one worker process (a new one after a
    crash, the crashing script alone in its own process); `timeout_s` per script."""
    return run_per_device(rank_dir, scripts, results_dir, timeout_s, () if device is None else (device,), on_done,
                          python)


def run_per_device(rank_dir: Path, scripts: Sequence[str], results_dir: Path, timeout_s: float,
                   devices: Sequence[str], on_done: Callable[[str, bench.ScriptResult], None] | None = None,
                   python: str = sys.executable) -> dict[str, bench.ScriptResult]:
    """Each script's result, measured in one worker per device of `devices` (none: one worker, the inherited
    device), each taking the next script when it is free (one timed script per GPU at a time)."""
    results: dict[str, bench.ScriptResult] = {}
    owner: dict[Job, str] = {}
    for script in dict.fromkeys(scripts):
        try:
            path = bench.script_path(rank_dir, script)
        except ValueError as e:
            results[script] = bench.ScriptResult(script, error=str(e))
            continue
        out = (results_dir / bench.result_name(script)).resolve()
        out.unlink(missing_ok=True)
        owner[Job(path, ("--benchmark", "--json", str(out)), out.with_suffix(".log"))] = script
    alone: dict[Job, bench.ScriptResult] = {}

    def run_alone(job: Job, env: Mapping[str, str], _worker_end: Finished) -> Finished:
        device = env.get("CUDA_VISIBLE_DEVICES") if devices else None
        alone[job] = bench.run_script(rank_dir, owner[job], results_dir, timeout_s, python, device)
        return Finished(job, 0 if alone[job].error is None else 1, 0.0, "alone")

    def finished(done: Finished) -> None:
        script = owner[done.job]
        if done.job in alone:
            result = alone[done.job]
        elif done.status is None:
            result = bench.ScriptResult(script, error=f"timed out after {timeout_s:g} s")
        else:
            result = bench.read_result(Path(done.job.args[-1]), script)
            if done.status:
                why = f"the script {how_it_ended(done.status)}" + (f": {done.note}" if done.note else "")
                result = (dataclasses.replace(result, note=why) if result.error is None
                          else bench.ScriptResult(script, error=why))
        results[script] = result
        if on_done is not None:
            on_done(script, result)

    slots = [bench.device_env(device) for device in devices] or [dict(os.environ)]
    run_jobs(list(owner), slots, timeout_s, run_alone, finished, worker_log=results_dir / "workers.log",
             python=python)
    return {script: results[script] for script in dict.fromkeys(scripts)}
