"""Long-lived worker processes that run scripts one after another, each as `__main__` in its own folder (`runpy`):
a dump's repro scripts for `verify` and `bench`, and the flush-time triage's children (`triage.at_flush`). Python,
torch, Thunder and nvFuser start once per worker, and inductor's, Triton's and nvFuser's in-memory caches carry over
from script to script, instead of 10-50 s of start-up and compile per script in processes of their own.

    finished = run_jobs([Job(path, args, log_path), ...], slots=[{"CUDA_VISIBLE_DEVICES": "0"}], timeout_s=300,
                        run_alone=..., on_done=...)

Each slot (an environment: a GPU, or one of `--jobs` CPU workers) holds one worker at a time, which takes the next
job from a queue that all slots share. A worker runs a job's script with its arguments, its stdout and stderr going to
the job's log file, and between scripts it resets what a script may leave behind: Dynamo's caches
(`torch._dynamo.reset`), inductor's and Dynamo's settings (a random piece's script sets `fallback_random`), the RNG
seeds (at random, as in a fresh interpreter), grad mode and default dtype, `sys.argv` and the working directory;
on CUDA it synchronises, so that an error a script left on the device shows there. The package cannot be imported
in a worker that runs repro scripts (they must stand alone); Thunder is imported once with the workaround the
scripts themselves carry (`thunder.script_support`).

A script that takes its worker down (a native abort, a segfault, a device-side assert that leaves the CUDA context
unusable) is run again alone (`run_alone`, a process of its own, whose fate is the script's result), and a new worker
carries on with the rest; a script past `timeout_s` is killed with its worker, and a new one carries on.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from thunderfx_debug.children.protocol import AnswerPipe, end_group, how_it_ended, message_line
from thunderfx_debug.children.standalone import REFUSE_THUNDERFX_DEBUG

#: The worker. argv[1]: the file descriptor it answers on; jobs arrive on stdin. Both one JSON object a line
#: (`protocol`), written here without the package, which a worker that runs repro scripts cannot import.
WORKER = r'''
import gc, io, json, os, random, runpy, sys, time, traceback

results = os.fdopen(int(sys.argv[1]), "w", buffering=1)
home = os.getcwd()

import torch, torch._dynamo, torch._dynamo.config, torch._inductor.config, torch._inductor.compile_fx
import importlib.util
if importlib.util.find_spec("thunder") is not None:
    try:
        import_thunder()  # defined by the support code before this loop (the scripts' own workaround)
    except Exception:
        traceback.print_exc()
if torch.cuda.is_available() and importlib.util.find_spec("nvfuser_direct") is not None:
    try:
        import nvfuser_direct  # noqa: F401
    except Exception:
        traceback.print_exc()
settings = (torch._inductor.config.save_config(), torch._dynamo.config.save_config())
default_dtype, saved_fds = torch.get_default_dtype(), (os.dup(1), os.dup(2))

def reset():
    torch._dynamo.reset()
    torch._inductor.config.load_config(settings[0])
    torch._dynamo.config.load_config(settings[1])
    torch.set_grad_enabled(True)
    torch.set_default_dtype(default_dtype)
    torch.seed()  # a fresh interpreter's generators are seeded at random (the scripts seed their own runs)
    random.seed()
    gc.collect()

reset()  # the warm-up imports leave the first script nothing the others would not find

for line in sys.stdin:
    job = json.loads(line)
    script, device_error, status, message = job["script"], "", 0, ""
    started = time.perf_counter()
    with open(job["log"], "w") as log:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(log.fileno(), 1); os.dup2(log.fileno(), 2)
        try:
            os.chdir(os.path.dirname(script))
            sys.argv = [script, *job["args"]]
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            message = "" if isinstance(e.code, int) or e.code is None else str(e.code)
            if message:
                print(message, file=sys.stderr)
        except BaseException as e:
            traceback.print_exc()
            status, message = 1, "".join(traceback.format_exception_only(type(e), e)).strip()
        finally:
            os.chdir(home)
            sys.argv = [sys.argv[0]]
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as e:  # an error the script left on the device: this process cannot go on
            device_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
        try:
            reset()
        except Exception as e:
            device_error = device_error or f"resetting after the script: {type(e).__name__}: {e}"[:400]
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved_fds[0], 1); os.dup2(saved_fds[1], 2)
    results.write(json.dumps({"id": job["id"], "status": status, "message": message[-400:],
                              "seconds": time.perf_counter() - started, "device_error": device_error}) + "\n")
    if device_error:
        sys.exit(3)
'''


@dataclasses.dataclass(frozen=True)
class Job:
    """A script to run with its arguments; its stdout and stderr go to `log` (relative paths are taken from this
    process's working directory)."""

    script: Path
    args: tuple[str, ...] = ()
    log: Path | None = None


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a job ended: `status` its exit status (None: killed at the timeout, or not run; negative: killed by a
    signal, in a run alone), wall seconds, `how` it ran, and `note` (what went wrong around the script: the
    worker's crash, an error left on the device)."""

    job: Job
    status: int | None
    seconds: float
    how: str = "worker"  # "worker", "alone", "timeout", "not_run" (past the deadline) or "cut" (at the deadline)
    note: str = ""


def worker_code(allow_package: bool = False) -> str:
    """The worker's program: the scripts' own Thunder support (to import Thunder as they do; standard library only
    at module level), then the loop; a worker that runs repro scripts refuses to import this package (they must
    stand alone), one that runs the package's own children (`allow_package`, the flush-time triage) does not."""
    import inspect

    from thunderfx_debug.thunder import script_support

    refusal = "" if allow_package else "import sys\n" + REFUSE_THUNDERFX_DEBUG + "\n"
    return refusal + inspect.getsource(script_support) + "\n" + WORKER


class _Worker:
    """One worker process and the pipe it answers on."""

    def __init__(self, code: str, env: Mapping[str, str], log: Path | None, python: str = sys.executable):
        self._answers = AnswerPipe()
        stderr = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [python, "-c", code, str(self._answers.child_fd)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=stderr, env=dict(env), pass_fds=(self._answers.child_fd,), start_new_session=True, text=True)
        except BaseException:
            self._answers.close()
            raise
        finally:
            self._answers.started()
            if stderr is not subprocess.DEVNULL:
                stderr.close()

    def send(self, message: dict) -> bool:
        try:
            self.process.stdin.write(message_line(message))
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def receive(self, deadline: float) -> dict | None | str:
        """The next result; "timeout" past `deadline` (time.monotonic()); None where the worker ended first."""
        return self._answers.receive(deadline)

    def stop(self) -> None:
        """Ends the worker and what it started (inductor's compile workers: its process group), waiting for it."""
        end_group(self.process.pid)
        self.process.wait()
        self.close()

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass
        self._answers.close()


def run_jobs(jobs: Sequence[Job], slots: Sequence[Mapping[str, str]], timeout_s: float,
             run_alone: Callable[[Job, Mapping[str, str], Finished], Finished],
             on_done: Callable[[Finished], None] | None = None, worker_log: Path | None = None,
             deadline: float | None = None, python: str = sys.executable,
             allow_package: bool = False) -> list[Finished]:
    """Runs `jobs` in one worker per slot (each slot the environment of its worker), the next job to whichever
    worker is free; returns how each ended, in the order of `jobs`. A job that takes its worker down runs again
    with `run_alone(job, env, how its worker ended)`. See the module docstring for crashes and timeouts.
    `worker_log` collects what the workers themselves print (a warm-up import that failed). Past `deadline` (a
    time.monotonic() value) no job starts: those left end "not_run", and a job running at the deadline is killed
    there ("cut"). Interrupted (KeyboardInterrupt), it ends its workers. `allow_package`: see `worker_code`."""
    code = worker_code(allow_package)
    pending: queue.Queue[int] = queue.Queue()
    for index in range(len(jobs)):
        pending.put(index)
    finished: list[Finished | None] = [None] * len(jobs)
    lock = threading.Lock()
    live: set[_Worker] = set()
    stopping = threading.Event()  # interrupted: the workers are being ended, their scripts are not results

    def done(index: int, result: Finished) -> None:
        finished[index] = result
        if on_done is not None:
            with lock:
                on_done(result)

    def retire(worker: _Worker) -> None:
        with lock:
            live.discard(worker)

    def serve(env: Mapping[str, str]) -> None:
        worker: _Worker | None = None
        try:
            while True:
                try:
                    index = pending.get_nowait()
                except queue.Empty:
                    return
                job = jobs[index]
                limit = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
                if limit <= 0:
                    done(index, Finished(job, None, 0.0, "not_run", "not started before the deadline"))
                    continue
                if worker is None:
                    try:
                        worker = _Worker(code, env, worker_log, python)
                    except OSError as e:  # no process to run it in (out of memory, no such interpreter)
                        done(index, Finished(job, None, 0.0, "not_run", f"no worker could be started: {e}"))
                        continue
                    with lock:
                        live.add(worker)
                started = time.monotonic()
                # Absolute: the worker runs each script in the script's own folder, where a relative path given on
                # the command line ("verify dump") would name another file.
                sent = worker.send({"id": index, "script": os.path.abspath(job.script), "args": list(job.args),
                                    "log": os.path.abspath(job.log) if job.log else os.devnull})
                reply = worker.receive(started + limit) if sent else None
                if stopping.is_set():
                    return
                if reply == "timeout":
                    worker.stop()
                    retire(worker)
                    worker = None
                    seconds = time.monotonic() - started
                    if limit < timeout_s:  # the deadline's cut, not the job's fault: no verdict on its time
                        done(index, Finished(job, None, seconds, "cut", f"cut at the deadline after {seconds:.0f} s "
                                             f"(its own limit: {timeout_s:g} s), with its worker"))
                    else:
                        done(index, Finished(job, None, seconds, "timeout",
                                             f"killed after {limit:.0f} s, with its worker"))
                elif reply is None:  # the worker died in this script: it runs alone, its own fate is its result
                    status = worker.process.wait()
                    worker.stop()  # and what it had started
                    retire(worker)
                    worker = None
                    alone = run_alone(job, env, Finished(job, status, time.monotonic() - started, "worker",
                                                         "took its worker down"))
                    done(index, dataclasses.replace(alone, how="alone", note=(
                        f"took its worker down (which {how_it_ended(status)}); run again alone" + (
                            f"; {alone.note}" if alone.note else ""))))
                elif reply["device_error"]:  # the script left the device unusable for the next one
                    worker.stop()
                    retire(worker)
                    worker = None
                    alone = run_alone(job, env, Finished(job, reply["status"], reply["seconds"], "worker",
                                                         f"left an error on the device ({reply['device_error']})"))
                    done(index, dataclasses.replace(alone, how="alone", note=(
                        f"left an error on the device ({reply['device_error']}); run again alone")))
                else:
                    done(index, Finished(job, reply["status"], reply["seconds"], "worker", reply["message"]))
        finally:
            if worker is not None:
                try:
                    worker.process.stdin.close()  # no more jobs: the worker's loop ends
                    worker.process.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                worker.stop()
                retire(worker)

    threads = [threading.Thread(target=serve, args=(env,), daemon=True) for env in slots]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # joined in steps, so that Ctrl-C reaches this thread
    finally:
        stopping.set()
        while not pending.empty():  # interrupted: no worker takes another job
            pending.get_nowait()
        with lock:
            remaining = list(live)
        for worker in remaining:
            worker.stop()
    return [f for f in finished if f is not None]


def run_process(argv: Sequence[str], log: Path, env: Mapping[str, str], timeout_s: float) -> int | None:
    """Runs `argv` in a process of its own, stdout and stderr into `log`; its exit status (negative: killed by that
    signal), or None where it ran past `timeout_s` and was ended with what it started (its process group)."""
    return end_process(start_process(argv, log, env), timeout_s)


def this_module_path() -> dict[str, str]:
    """This process's environment with its module path as PYTHONPATH: a fresh interpreter imports the package (and a
    user's executor modules) from where this process does."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}


def start_process(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """`argv` started in a process of its own (a session, so that it can be ended with what it starts), stdout and
    stderr into `log`; `end_process` waits for it."""
    with open(log, "w") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env), start_new_session=True)


def end_process(process: subprocess.Popen, timeout_s: float) -> int | None:
    """`process`'s exit status (negative: killed by that signal), or None where it ran past `timeout_s` more and was
    ended with its process group."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(process.pid)
        process.wait()
        return None
