"""A fork server: a fresh interpreter that imports torch (and, on a machine without a GPU, Thunder, with the workaround
`import thunder` needs on this torch) once and then forks a child per request (`forks.forked`), so that each child
starts without importing them again: what runs the trials of `thunderfx-debug minimize`. It initialises no CUDA
itself: a child forked from a process that did cannot use it. So it asks torch whether there is a GPU through NVML
(PYTORCH_NVML_BASED_CUDA_CHECK, which initialises nothing), and where there is one it leaves Thunder to each child
(importing nvFuser may initialise CUDA). It sees the environment the command was started with (a custom executor
registered by a `sitecustomize` or an imported module is there too).

    with ForkServer() as server:               # started at its first request
        status = server.forked(forks.run_script, (script, log, argv), timeout_s=600)

`ForkServer.forked` takes what `forks.forked` takes, for the targets `forks.run_script` and `forks.run_function`, and
answers as it does; the server (`serve`) and its client are both here, the protocol's one owner.

Messages (`protocol`): requests on stdin, `{"script", "log", "argv", "timeout"}` (run a script) or
`{"call", "args", "log", "timeout"}` (call `module:function`); first `{"ready": ...}` once the imports are done, then
each request answered by `{"returncode": ...}` (an exit status as `forks.forked` gives it), on the pipe whose file
descriptor is the server's argv[1].
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from thunderfx_debug.children import forks
from thunderfx_debug.children.protocol import AnswerPipe, end_group, message_line

#: How long the server may take to import torch and Thunder, and to fork and reap a child beyond its time limit.
START_S, SLACK_S = 600.0, 60.0


def serve(answer_fd: int) -> None:
    answers = os.fdopen(answer_fd, "w", buffering=1)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() initialises no CUDA
    import torch

    if not torch.cuda.is_available() and importlib.util.find_spec("thunder") is not None:
        from thunderfx_debug.thunder.script_support import import_thunder

        import_thunder()  # with the workaround `import thunder` needs on this torch
    answers.write(message_line({"ready": True, "cuda_initialised": torch.cuda.is_initialized()}))
    for line in sys.stdin:
        request = json.loads(line)
        if "script" in request:
            target, args = forks.run_script, (request["script"], request["log"], request["argv"])
        else:
            target, args = forks.run_function, (request["call"], request["log"], request["args"])
        returncode = forks.forked(target, args, request["timeout"])
        answers.write(message_line({"returncode": returncode}))


class ForkServer:
    """The client of one server process (`serve`), started at the first request. Close it (or use it as a context
    manager) to end the server."""

    def __init__(self):
        self._server: subprocess.Popen | None = None
        self._answers: AnswerPipe | None = None
        self._server_log: Path | None = None

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                server.stdin.close()  # no more requests: the server's loop ends
            except OSError:  # it has ended, with a request still unsent
                pass
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                end_group(server.pid)
                server.wait()
        if self._answers is not None:
            self._answers.close()
            self._answers = None
        if self._server_log is not None:
            self._server_log.unlink(missing_ok=True)
            self._server_log = None

    def forked(self, target: Callable, args: Sequence, timeout_s: float) -> int | None:
        """Runs `target(*args)` (`forks.run_script` or `forks.run_function`, with their arguments) in a child forked
        by the server; its exit status as `forks.forked` gives it. Raises RuntimeError where the server has ended."""
        if target is forks.run_script:
            script, log, argv = args
            request = {"script": script, "log": log, "argv": list(argv)}
        elif target is forks.run_function:
            call, log, call_args = args
            request = {"call": call, "log": log, "args": list(call_args)}
        else:
            raise ValueError(f"{target!r}: a fork server runs forks.run_script or forks.run_function")
        server = self._started()
        try:
            server.stdin.write(message_line({**request, "timeout": timeout_s}))
            server.stdin.flush()
        except BrokenPipeError:
            pass  # the server has ended: `_answer` says why
        return self._answer(timeout_s + SLACK_S)["returncode"]

    def _answer(self, within_s: float) -> dict:
        answer = self._answers.receive(time.monotonic() + within_s)
        if isinstance(answer, dict):
            return answer
        how = "stopped answering" if answer == "timeout" else "ended unexpectedly"
        tail = self._server_log.read_text(errors="replace")[-2000:] if self._server_log else ""
        self.close()
        raise RuntimeError(f"the process that runs the trials {how}: {tail}")

    def _started(self) -> subprocess.Popen:
        if self._server is None:
            handle, name = tempfile.mkstemp(prefix="thunderfx_debug_trials_", suffix=".log")
            os.close(handle)
            self._server_log = Path(name)
            self._answers = AnswerPipe()
            with open(name, "w") as errors:
                try:
                    # Its stdout, and the children's before they open their logs, into its log: answers have a pipe
                    # of their own.
                    self._server = subprocess.Popen(
                        [sys.executable, "-c", "import sys; from thunderfx_debug.children.fork_server import serve; "
                         "serve(int(sys.argv[1]))", str(self._answers.child_fd)],
                        stdin=subprocess.PIPE, stdout=errors, stderr=errors, text=True, env=dict(os.environ),
                        pass_fds=(self._answers.child_fd,), start_new_session=True)
                finally:
                    self._answers.started()
            self._answer(START_S)  # ready: what it preloads is imported
        return self._server


if __name__ == "__main__":
    serve(int(sys.argv[1]))
