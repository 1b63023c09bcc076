"""The process that forks the trials of `thunderfx-debug minimize`: a fresh interpreter that imports torch (and,
on a machine without a GPU, Thunder, with the workaround `import thunder` needs on this torch) once and then forks a
child per request, so that each trial starts without importing them again. It initialises no CUDA itself: a child
forked from a process that did cannot use it. So it asks torch whether there is a GPU through NVML
(PYTORCH_NVML_BASED_CUDA_CHECK, which initialises nothing), and where there is one it leaves Thunder to each child
(importing nvFuser may initialise CUDA). It sees the environment the command was started with (a custom executor
registered by a `sitecustomize` or an imported module is there too).

Protocol (one JSON object a line): requests on stdin, `{"script", "log", "argv", "timeout"}` (run a script) or
`{"call", "args", "log", "timeout"}` (call `module:function`); each answered on stdout by a line starting with
`ANSWER` and `{"returncode": ...}` (None: stopped at its time limit; negative: killed by that signal).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

ANSWER = "THUNDERFX_DEBUG_MINIMIZE_SERVER "


def serve() -> None:
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() initialises no CUDA
    import torch

    from thunderfx_debug.children import forks as children

    if not torch.cuda.is_available() and importlib.util.find_spec("thunder") is not None:
        from thunderfx_debug.thunder.script_support import import_thunder

        import_thunder()  # with the workaround `import thunder` needs on this torch
    print(ANSWER + json.dumps({"ready": True, "cuda_initialised": torch.cuda.is_initialized()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "script" in request:
            target, args = children.run_script, (request["script"], request["log"], request["argv"])
        else:
            target, args = children.run_function, (request["call"], request["log"], request["args"])
        returncode = children.forked(target, args, request["timeout"])
        print(ANSWER + json.dumps({"returncode": returncode}), flush=True)


if __name__ == "__main__":
    serve()
