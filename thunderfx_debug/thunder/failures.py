"""Reading a failure of the run: the exception Thunder, nvFuser, inductor or a user's executor raised, as it was raised
(not Dynamo's wrapper of it, nor the advice Dynamo appends to its message), the frame that raised it, and the fusion
region of Thunder's trace it was raised in; and watching the backward of a thunder split, whose failures raise inside
autograd's engine, out of reach of the split's own call.

Checked against lightning-thunder 0.2.6 and torch 2.11 to 2.13. What it relies on:

- Thunder runs each cache entry's backward as `ThunderFunction.backward` -> `ctx.compiled_backward(...)`, the
  entry's `backward_fn` (thunder/executors/torch_autograd.py), which `maybe_connect_to_autograd` reads from the cache
  entry on every call (thunder/__init__.py). The entries are `CacheEntry` namedtuples in
  `compile_stats(fn).interpreter_cache`: an entry whose `backward_fn` is wrapped (`_replace`) hands the wrapper to
  every later call, and a call whose forward already ran holds its own in its autograd node's `compiled_backward`
  (ThunderFX disables Thunder's split autograd functions, so the node of every output is the ThunderFunction's).
- Thunder compiles its traces with `thunder.<name>_<n>` file names (`thunder.computation_3`,
  `thunder.backward_fn_4`) and puts their text in `linecache`, so a traceback frame of a trace reads the line it was
  running: `[t5] = nvFusion0(t1, t2)` names the region.
- Dynamo's wrappers of an exception and the advice it appends to messages, which `scripts/run_failure.py` takes
  off (the repro scripts carry that module, and judge their own exceptions by it).
"""

from __future__ import annotations

import dataclasses
import linecache
import re
from collections.abc import Callable
from typing import Any

from thunderfx_debug.records import short_path
from thunderfx_debug.scripts.run_failure import own_exception, own_message, raised_in, type_name

#: The fusion region a line of a Thunder trace may call: `[t5] = nvFusion0(t1, t2)`, `(t3,) = TorchCompile1(...)`
#: (a name that ends in a number; whether the split has such a region is decided where its regions are known).
_REGION_CALL = re.compile(r"=\s*([A-Za-z_]\w*?\d+)\(")


@dataclasses.dataclass(frozen=True)
class ExceptionFacts:
    """The exception as it was raised: `type` ("AssertionError"; `module.Name` beyond the builtins), its own
    `message`, the innermost frame (`raised_at`, "thunder/executors/torch_autograd.py:75 forward", and
    `raised_code`, its line), and `region`, what the innermost frame of a Thunder trace was calling where that
    looks like a fusion region ("nvFusion0_forward"; None where no trace frame called one)."""

    type: str
    message: str
    raised_at: str = ""
    raised_code: str = ""
    region: str | None = None
    raised_in: str = ""  # the innermost frame's file name and function, as `scripts.run_failure` compares them


def exception_facts(error: BaseException) -> ExceptionFacts:
    """What `error` was (see `ExceptionFacts`), Dynamo's wrappers taken off."""
    error = own_exception(error)
    raised_at = raised_code = ""
    region = None
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        if code.co_filename.startswith("thunder."):
            found = _REGION_CALL.search(line)
            if found:
                phase = "backward" if code.co_filename.startswith("thunder.backward") else "forward"
                region = f"{found.group(1)}_{phase}"
        raised_at, raised_code = f"{short_path(code.co_filename)}:{tb.tb_lineno} {code.co_name}", line
        tb = tb.tb_next
    return ExceptionFacts(type_name(error), own_message(error)[:4000], raised_at, raised_code[:300], region,
                          raised_in(error))


# ---- the backward of a thunder split ---------------------------------------------------------------------------------


class WatchedBackward:
    """A cache entry's backward function that tells `on_failure(error)` of an exception it raises, then lets the
    exception go on as it would have: the same call, the same arguments (Thunder empties its lists of saved tensors
    as it goes, which this frame holds no more of than Thunder's own does), the same result."""

    def __init__(self, backward_fn: Callable, on_failure: Callable[[BaseException], None]):
        self.backward_fn, self.on_failure = backward_fn, on_failure

    def __call__(self, *args, **kwargs):
        try:
            return self.backward_fn(*args, **kwargs)
        except Exception as error:  # not KeyboardInterrupt or SystemExit: no failure of the backward's own
            self.on_failure(error)
            raise


def watch_backward(compiled: Any, outputs: Any, on_failure: Callable[[BaseException], None]) -> None:
    """Makes the backward functions of a thunder split's cache entries, and of the call that returned `outputs`
    (its forward ran before its entry was watched), tell `on_failure` of an exception they raise. Entries Thunder
    makes later (for other inputs) are watched from the next call of this."""
    import thunder
    from torch.utils._pytree import tree_leaves

    try:
        stats = thunder.compile_stats(compiled)
    except Exception:  # not a Thunder function, or not compiled yet
        return
    cache = getattr(stats, "interpreter_cache", None) or []
    watched: dict[int, WatchedBackward] = {}
    for i, entry in enumerate(cache):
        backward = getattr(entry, "backward_fn", None)
        if backward is None:
            continue
        if not isinstance(backward, WatchedBackward):
            backward = WatchedBackward(backward, on_failure)
            cache[i] = entry._replace(backward_fn=backward)
        watched[id(backward.backward_fn)] = backward
    for leaf in tree_leaves(outputs):
        node = getattr(leaf, "grad_fn", None)
        held = getattr(node, "compiled_backward", None)
        if held is not None and not isinstance(held, WatchedBackward) and id(held) in watched:
            node.compiled_backward = watched[id(held)]
