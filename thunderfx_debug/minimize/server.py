"""The process that forks the trials of `thunderfx-debug minimize`: a fresh interpreter that imports torch and
Thunder once (with the workaround `import thunder` needs on this torch) and then forks a child per request, so that
each trial starts in milliseconds instead of importing them again. It touches no GPU itself (a fork of a process
that did could not use CUDA), and sees the environment the command was started with (a custom executor registered
by a `sitecustomize` or an imported module is there too).

Protocol (one JSON object a line): requests on stdin, `{"script", "log", "argv", "timeout"}` (run a script) or
`{"call", "args", "log", "timeout"}` (call `module:function`); each answered on stdout by a line starting with
`ANSWER` and `{"returncode": ...}` (None: stopped at its time limit; negative: killed by that signal).
"""

from __future__ import annotations

import importlib.util
import json
import sys

ANSWER = "THUNDERFX_DEBUG_MINIMIZE_SERVER "


def serve() -> None:
    import torch  # noqa: F401

    from thunderfx_debug.minimize import child

    if importlib.util.find_spec("thunder") is not None:
        from thunderfx_debug.thunder.script_support import import_thunder

        import_thunder()  # with the workaround `import thunder` needs on this torch
    print(ANSWER + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "script" in request:
            target, args = child.run_script, (request["script"], request["log"], request["argv"])
        else:
            target, args = child.run_function, (request["call"], request["log"], request["args"])
        returncode = child.forked(target, args, request["timeout"])
        print(ANSWER + json.dumps({"returncode": returncode}), flush=True)


if __name__ == "__main__":
    serve()
