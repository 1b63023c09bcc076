"""`thunderfx-debug bench` in one process per GPU: a worker interpreter runs the dump's scripts one after another with
`--benchmark --json PATH`, each as `__main__` in its own folder (`runpy`), so that Python, torch, Thunder and nvFuser
start once and inductor's and Triton's in-memory caches carry over from script to script, instead of 15-50 s of
start-up and compile per script in processes of their own.

A script that crashes its process (a native abort, a device-side assert that leaves the CUDA context unusable) takes
the worker with it: the script the worker had started is then run alone in its own process (`bench.run_script`,
which records the crash as that script's result), and a new worker carries on with the rest.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from thunderfx_debug import bench

#: The worker: argv = [results dir, script paths...]; prints START/DONE lines the parent follows.
WORKER = r"""
import json, os, runpy, sys, traceback
from pathlib import Path
results = Path(sys.argv[1])
for script in sys.argv[2:]:
    path = Path(script)
    out = results / (path.name[:-3] + ".json")
    print("START " + json.dumps(script), flush=True)
    status, message = 0, ""
    here, argv = os.getcwd(), sys.argv
    try:
        os.chdir(path.parent)
        sys.argv = [str(path), "--benchmark", "--json", str(out)]
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        message = "" if isinstance(e.code, int) or e.code is None else str(e.code)
    except BaseException as e:
        status, message = 1, "".join(traceback.format_exception_only(type(e), e)).strip()
    finally:
        os.chdir(here)
        sys.argv = argv
    print("DONE " + json.dumps({"script": script, "status": status, "message": message[-400:]}), flush=True)
"""


def run_in_one_process(rank_dir: Path, scripts: Sequence[str], results_dir: Path, timeout_s: float,
                       python: str = sys.executable, device: str | None = None,
                       on_done: Callable[[str, bench.ScriptResult], None] | None = None) -> dict[str, bench.ScriptResult]:
    """Each script's result (scripts relative to `rank_dir`), measured in one worker process (a new one after a
    crash, the crashing script alone in its own process). `timeout_s` is per script, on average, for the worker."""
    results: dict[str, bench.ScriptResult] = {}
    remaining = []
    for script in dict.fromkeys(scripts):
        try:
            remaining.append((script, bench.script_path(rank_dir, script)))
        except ValueError as e:
            results[script] = bench.ScriptResult(script, error=str(e))
    while remaining:
        by_path = {str(path): script for script, path in remaining}
        for _, path in remaining:
            (results_dir / bench.result_name(str(path))).unlink(missing_ok=True)
        command = [python, "-c", WORKER, str(results_dir.resolve()), *by_path]
        started: str | None = None
        done: set[str] = set()
        try:
            worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      env=bench.device_env(device))
            assert worker.stdout is not None
            for line in worker.stdout:
                kind, _, payload = line.rstrip("\n").partition(" ")
                if kind == "START":
                    started = json.loads(payload)
                elif kind == "DONE":
                    data = json.loads(payload)
                    script = by_path[data["script"]]
                    result = bench.read_result(results_dir / bench.result_name(data["script"]), script)
                    if data["status"]:
                        why = f"exit status {data['status']}" + (f": {data['message']}" if data["message"] else "")
                        result = (dataclasses.replace(result, note=why) if result.error is None
                                  else bench.ScriptResult(script, error=why))
                    results[script] = result
                    done.add(data["script"])
                    started = None
                    if on_done is not None:
                        on_done(script, result)
            worker.wait(timeout=timeout_s * max(len(remaining), 1))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        remaining = [(s, p) for s, p in remaining if str(p) not in done]
        if started is not None and remaining:
            # The worker died in this script: it runs alone, and its own process's fate is its result.
            script = by_path[started]
            results[script] = bench.run_script(rank_dir, script, results_dir, timeout_s, python, device)
            if on_done is not None:
                on_done(script, results[script])
            remaining = [(s, p) for s, p in remaining if str(p) != started]
        elif remaining and started is None and not done:
            for script, _ in remaining:  # the worker could not start at all
                results[script] = bench.ScriptResult(script, error="the bench worker exited before running it")
            remaining = []
    return results


def run_per_device(rank_dir: Path, scripts: Sequence[str], results_dir: Path, timeout_s: float,
                   devices: Sequence[str], on_done: Callable[[str, bench.ScriptResult], None] | None = None,
                   python: str = sys.executable) -> dict[str, bench.ScriptResult]:
    """`run_in_one_process` with one worker per device of `devices` (none: one worker, the inherited device), the
    scripts dealt out in turn."""
    from concurrent.futures import ThreadPoolExecutor

    scripts = list(dict.fromkeys(scripts))
    if len(devices) <= 1:
        return run_in_one_process(rank_dir, scripts, results_dir, timeout_s, python, devices[0] if devices else None,
                                  on_done)
    shares = [scripts[i::len(devices)] for i in range(len(devices))]
    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        parts = pool.map(lambda i: run_in_one_process(rank_dir, shares[i], results_dir, timeout_s, python,
                                                      devices[i], on_done), range(len(devices)))
        merged = {k: v for part in parts for k, v in part.items()}
    return {script: merged[script] for script in scripts}
