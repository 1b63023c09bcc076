"""What Dynamo attached to a graph it hands a backend: compile id, why the graph ended where it did, why the frame
was recompiled, and which function it comes from. These are Dynamo internals (torch 2.5 to 2.13); every reading
here is optional and falls back to None where torch moved it."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    """`compile_id` is Dynamo's ("0/0"; "0/1" for the first recompile of frame 0); `break_reason` why Dynamo ended
    the graph where it did (None when the frame ended normally) and `break_user_stack` where, as
    "file:line in function"; `recompile_reason` the guard that failed, for recompiles; `frame` the function whose
    frame was compiled, as "forward (/path/models.py:86)"."""

    compile_id: str | None = None
    break_reason: str | None = None
    break_user_stack: tuple[str, ...] = ()
    recompile_reason: str | None = None
    frame: str | None = None

    @property
    def frame_id(self) -> str | None:
        """The frame part of the compile id ("0" of "0/1")."""
        return self.compile_id.split("/")[0] if self.compile_id else None


def graph_facts(gm: torch.fx.GraphModule) -> GraphFacts:
    """The facts of the graph Dynamo is handing to the backend now (call it from the backend call)."""
    from torch._guards import CompileContext

    compile_id = gm.meta.get("dynamo_compile_id") or CompileContext.current_compile_id()
    reason = getattr(gm, "compile_subgraph_reason", None)
    break_reason, user_stack = None, ()
    if reason is not None and getattr(reason, "graph_break", False):
        break_reason = str(reason.reason)
        user_stack = tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in (reason.user_stack or ()))
    return GraphFacts(
        compile_id=str(compile_id) if compile_id is not None else None,
        break_reason=break_reason,
        break_user_stack=user_stack,
        recompile_reason=_recompile_reason(),
        frame=_frame_name(),
    )


def _frame_name() -> str | None:
    """The function whose frame Dynamo is compiling; None where unknown.

    Dynamo's tracing context lists the code objects traced for this graph, the frame's own code first
    (`OutputGraph.__init__` appends it before any inlined function).
    """
    try:
        from torch._dynamo.utils import get_traced_code

        codes = get_traced_code() or []
    except Exception:  # an internal API; the name only makes warnings friendlier
        return None
    if not codes:
        return None
    code = codes[0]
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def _recompile_reason() -> str | None:
    """The guard failure that made Dynamo recompile this frame, where Dynamo recorded one.

    Dynamo (torch 2.5 to 2.13 at least) computes it in `convert_frame._compile` before tracing and stores it only in
    the metrics context of the compilation in progress (`metrics_context.update_outer({"recompile_reason": ...})`),
    which has setters but no getter: we read its `_metrics` dict. None on a first compile, or where it moved.
    """
    try:
        from torch._dynamo.utils import get_metrics_context

        context = get_metrics_context()
        if not context.in_progress():
            return None
        reason = getattr(context, "_metrics", {}).get("recompile_reason")
    except Exception:  # an internal API that moves between torch versions; the reason is optional
        return None
    return str(reason) if reason else None
