"""Thunder's side of running a split of the run again in a process of its own (`triage.child`): what of the
run's compile a child needs (`prologue_pruning`, `executor_objects`), the compile itself as ThunderFX made it
(`jit_as_in_the_run`), and whether it made the same code (`same_trace`).

Checked against lightning-thunder 0.2.6:
- ThunderFX jits each split with `partial(thunder.jit, **options)`, where the options carry, in `transforms`, an
  `ExtractionOnlyPrologueTransform(skip_check_on_input_tensors=...)` (`thunder.dynamo.compiler.
  _with_prologue_pruning_transform`, True under torch.compile with static shapes); it changes the prologue only, and
  is read back from the split's `thunder.compile_data(...).transforms`.
- A trace printed by `str()` starts with comments `# Constructed by <pass> (took N milliseconds)` whose times vary
  from compile to compile, and names the FX module's source lines by the file torch.fx compiled its code under,
  `<eval_with_key>.N`, N counting the GraphModules of the process; every other line is the trace's code and its
  proxies' shapes, dtypes and devices.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from thunderfx_debug.thunder.instrument import FusionTimingTransform
from thunderfx_debug.thunder.script_support import executors as executors_by_name
from thunderfx_debug.thunder.script_support import import_thunder


def prologue_pruning(compiled: Callable) -> bool | None:
    """`skip_check_on_input_tensors` of the prologue pruning ThunderFX gave a split (None: it had none)."""
    import thunder
    from thunder.transforms.extraction_only_prologue_transform import ExtractionOnlyPrologueTransform

    for transform in thunder.compile_data(compiled).transforms:
        if isinstance(transform, ExtractionOnlyPrologueTransform):
            return bool(transform.skip_check_on_input_tensors)
    return None


def other_transforms(compiled: Callable) -> list[str]:
    """The transforms of a split that are neither ThunderFX's prologue pruning nor our timing marks: the user's, which
    a child process cannot be given (objects, not names)."""
    import thunder
    from thunder.transforms.extraction_only_prologue_transform import ExtractionOnlyPrologueTransform

    return [type(t).__name__ for t in thunder.compile_data(compiled).transforms
            if not isinstance(t, ExtractionOnlyPrologueTransform | FusionTimingTransform)]


def executor_objects(options: dict[str, Any]) -> list[Any]:
    """The run's executors (Thunder's defaults where the options name none)."""
    import thunder

    value = options.get("executors")
    return list(thunder.resolve_executors(value)) if value is not None else list(thunder.get_default_executors())


def jit_as_in_the_run(gm: Any, options: dict[str, Any], executor_names: Sequence[str] | None,
                      modules: Iterable[str], pruning: bool | None) -> Callable:
    """`thunder.jit(gm)` as ThunderFX jitted the split in the run: its literal `options`, its executors by name
    (after importing `modules`, which register executors of the user's), and its prologue pruning.

    Raises:
        LookupError: an executor the run had is not registered here (its module could not register it).
    """
    import_thunder()
    import thunder
    from thunder.transforms.extraction_only_prologue_transform import ExtractionOnlyPrologueTransform

    failed = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001  (said in the error below where an executor is then missing)
            failed.append(f"{module} ({type(e).__name__}: {e})")
    options = dict(options)
    if executor_names is not None:
        try:
            options["executors"] = executors_by_name(executor_names)
        except LookupError as e:
            imported = f"; importing {', '.join(failed)} failed" if failed else ""
            raise LookupError(f"{e}{imported}") from e
    if pruning is not None:
        options["transforms"] = [ExtractionOnlyPrologueTransform(skip_check_on_input_tensors=pruning)]
    return thunder.jit(gm, **options)


def final_trace_texts(compiled: Callable) -> tuple[str | None, str | None]:
    """The printed final forward and backward traces of a jitted split after its first call."""
    from thunderfx_debug.thunder.traces import final_traces

    forward, backward = final_traces(compiled)
    return (None if forward is None else str(forward)), (None if backward is None else str(backward))


_FX_FILE = re.compile(r"<eval_with_key>\.\d+")


def _code_lines(text: str | None) -> list[str]:
    return [_FX_FILE.sub("<eval_with_key>", line) for line in (text or "").splitlines()
            if not line.lstrip().startswith("# Constructed by")]


def same_trace(ours: str | None, theirs: str | None) -> str | None:
    """None where two printed traces are the same code; else the first line that differs, both ways.

    Example:
        >>> a = "# Constructed by Delete Last Used (took 1 milliseconds)\\nt0 = add(x, y)"
        >>> same_trace(a, a.replace("took 1", "took 7")) is None, same_trace(a, "t0 = mul(x, y)")
        (True, "line 1: 't0 = add(x, y)' against the run's 't0 = mul(x, y)'")
    """
    mine, run = _code_lines(ours), _code_lines(theirs)
    for number, (a, b) in enumerate(zip(mine, run), 1):
        if a != b:
            return f"line {number}: {a.strip()!r} against the run's {b.strip()!r}"
    if len(mine) != len(run):
        return f"{len(mine)} lines against the run's {len(run)}"
    return None
