"""Children forked from a process that has not initialised CUDA: `forked` runs a target in one, and the targets
(`run_script`: a script as `python script.py` would run it, in its own folder with its own argv as `__main__`;
`run_function`: `module:function(*args)`) send its output into a log file and end it with their exit status.

A fork starts at once, with torch, Thunder and every executor the parent registered already loaded (a custom one of
the training script's too): the triage's children in a process without CUDA, the minimizer's at flush, and
`thunderfx-debug minimize`'s trials, forked by a server that imported torch and Thunder once (`fork_server`). Where
this process may fork such a child is decided here, once (`can_fork`); where it may not, `pool`'s fresh interpreters
run the pieces instead. Kept free of heavy imports, so that the parent can name these functions as targets."""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def into(log: str) -> None:
    """Descriptors 1 and 2 and Python's streams into `log`: the parent's `sys.stdout` may be an object of its own (a
    notebook's, a test runner's capture) that a forked child must not write into."""
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as long as the child)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    import faulthandler

    if faulthandler.is_enabled():  # the parent's (a test runner's) writes to its own copy of its stderr
        faulthandler.enable(file=sys.stderr)


def run_script(script: str, log: str, argv: list[str]) -> None:
    """Runs `script` as `__main__` and ends the process with its exit status (never returns)."""

    def script_status() -> int:
        os.chdir(os.path.dirname(script) or ".")
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
            return 0
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)

    _exit_with(log, script_status)


def run_function(target: str, log: str, args: list) -> None:
    """Calls `module:function(*args)` with the output into `log`, exit status 0 when it returns (used for the
    steps that must run where the trials do, e.g. asking Thunder for nvFuser's definition of a minimal region)."""

    def called() -> int:
        import importlib

        module, _, name = target.partition(":")
        getattr(importlib.import_module(module), name)(*args)
        return 0

    _exit_with(log, called)


def _exit_with(log: str, work) -> None:
    """Ends this child with the status `work()` returns (1 where it raised, its traceback printed), its output into
    `log`, Dynamo's and inductor's state as a fresh process has them: a fork of the training process holds its
    Dynamo caches and inductor's workers, and one of a process that ran OpenMP threads must not use them."""
    code = 1
    try:
        into(log)
        from thunderfx_debug.thunder.torch_private import fresh_compile_state

        fresh_compile_state()
        code = work()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def can_fork() -> bool:
    """Whether this process may run a piece in a forked child (`forked`) rather than a fresh interpreter (`pool`): it
    has `os.fork` and has not initialised CUDA. A forked child can neither use its parent's CUDA context nor make one
    of its own, so a process that initialised CUDA cannot fork a child that uses it; where it can, a fork is the better
    child, starting at once with the parent's modules and every executor it registered. The one place that decides:
    the triage (`triage.at_flush.forks`) and the minimizer (`minimize.flush_child`, a flagged piece's process at
    flush, and `minimize.trials.TrialRunner.in_this_process`, its trials) ask it."""
    import torch

    return hasattr(os, "fork") and not (torch.cuda.is_available() and torch.cuda.is_initialized())


def forked(target, args, timeout_s: float) -> int | None:
    """Runs `target(*args)` (which ends its process) in a forked child of this process; its exit status (negative:
    killed by that signal), or None where it ran past `timeout_s` seconds and was killed."""
    import time

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            target(*args)
        finally:
            os._exit(1)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
    except BaseException:  # interrupted (Ctrl-C): the child does not outlive the wait for it
        _end(pid)
        raise
    _end(pid)
    return None


def _end(pid: int) -> None:
    """Kills the forked child `pid` and reaps it. The child alone, not a group: a fork stays in its parent's process
    group (the group `protocol.end_group` ends, where the parent is a child here itself), and starts no compile
    workers (`fresh_compile_state`)."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
