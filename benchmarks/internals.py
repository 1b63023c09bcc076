"""The package's inside, for the benchmarks that measure it: every name a benchmark takes from thunderfx_debug beyond
its public names (docs/architecture.md, "The public names"), and why. No other benchmark imports anything of the
package but its public names, nor patches it (tests/test_benchmarks.py).

    from internals import CudaClock      # thunderfx_debug.recording.timing.CudaClock

A name is imported from the package on first use: a benchmark imports no more of the package, and no sooner, than
the names it takes need.

The training path's parts, measured alone:
- `CudaClock`, `HostClock`, `DeviceHold`, `bracket_cost_ms` (recording.timing): fidelity.py calibrates what one
  region's bracket of marks costs on the clock the backend used, the candidate correction of short regions.
- `RegionTimer` (recording.timing), with `HostClock`: host_overhead.py --marks times one unarmed op mark alone.
- `GraphRunner`, `SplitRunner` (recording.runners), `Sampling` (recording.timing), `CheckSchedule`,
  `TimingBesideChecks` (recording.check), `host_series` (recording.host): host_overhead.py --runners builds the
  runners around functions that return their argument, with and without the sentinel's schedule, to time them at
  a resolution no compiled graph gives; flush_pause.py times `GraphRunner`'s clock check with a `PeriodicFlush`
  (recording.periodic) that is never due, against none.
- `time_calls`: sampled_step_parts.py wraps the functions a sampled call runs (the memory meter, the samplers, the
  clocks, the host readings) with time accumulators; the wrappers go onto the package's modules and classes here.
- `MAX_EVENTS` (recording.memory), `torch_private` (thunder.torch_private): sampled_step_parts.py times the
  allocator calls the memory meter makes, alone, with the history bounded as the meter bounds it.
- `recorded_graphs`, `put_splits`: host_overhead.py takes a compiled graph's split runners off the backend's
  recorder and calls the graph with them and with the bare splits put in their place (`put_splits`), to time what
  the runners cost alone; --marks counts the marks in each Thunder split's instrumented traces.
- `package_module`: path_parts.py files profiled functions under the parts of the training path by their module and
  class, so it imports the package's modules by their paths.

The sentinel:
- `CheckTally` (recording.check): overhead.py sums what each split's checks were charged against
  THUNDERFX_DEBUG_CHECK_SHARE (its `turn`'s totals): their own blocks, and what the checked calls' periods held
  beyond them.
- `watching_backward_captures`: sentinel_zoo.py's capture diagnostic sets each gradient the sentinel captured of a
  parameter, and whether it proved the capture, against that parameter's .grad after the backward: it reads them off
  each backward check (recording.split_check's `BackwardCheck`) before the check judges them, and each parameter's
  address before the check swaps it for a copy. split_check offers no hook for that, so this wraps
  `BackwardCheck.check` and `BackwardCheck._split_backward_done` for the duration of a `with` block.

The flush-time triage:
- `keeping_triage_step_lines`: flush_triage.py takes a flush's time apart (the children's start, each step of each
  split's child, the flush's own work around them) from the step lines the children write with their wall-clock
  times (triage.jobs' `results.jsonl`); the triage deletes its folders when it is done, so this copies each split's
  lines out first, for the duration of a `with` block.

Repro scripts and the minimizer:
- `run_script` (children.standalone): zoo.py, minimize.py and real_inputs_scripts.py run repro scripts as
  `thunderfx-debug verify` does, each in a fresh interpreter where thunderfx_debug cannot be imported, and read how
  each run ended, what it printed and how long it took.
- `verify` (commands.verify): zoo.py verifies the scripts of several dumps (one per model) in one pool of workers,
  and writes verify.json and verify.md over all of them; the command verifies one dump (its ranks) at a time.
- `minimize_script`, `NotAScript` (minimize.offline), `NotMinimized` (minimize.piece), `TrialRunner`
  (minimize.trials): minimize.py runs `thunderfx-debug minimize`'s work with the trial runner it chooses and records
  the reduction's figures (ops before and after, trials, budget spent), which the command prints as text only.
- `script_support` (thunder.script_support): minimize.py's tiny run starts processes where thunderfx_debug cannot be
  imported (the training's trials, the minimal script) with a wrong executor registered at start; they import
  thunder through this module's text, as the repro scripts carry it.

The sentinel's draws:
- `nvfuser_uniform` (scripts.philox_draws): dropout_compared.py --cost times what drawing an nvFusion region's dropout
  again costs a checked call, one draw per dropout shape, against torch's own draws.

Versions:
- `OWN_OPTIONS` (settings.config): distributed.py asks whether this version of the package has the correctness
  check (`check` among ReportingBackend's own options) before it asks ReportingBackend for one.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

#: name -> (the module of the package it comes from, its attribute there; None: the module itself).
HANDED_OUT: dict[str, tuple[str, str | None]] = {
    **{name: ("thunderfx_debug.recording.timing", name)
       for name in ("CudaClock", "HostClock", "DeviceHold", "bracket_cost_ms", "RegionTimer", "Sampling")},
    **{name: ("thunderfx_debug.recording.runners", name) for name in ("GraphRunner", "SplitRunner")},
    **{name: ("thunderfx_debug.recording.check", name)
       for name in ("CheckSchedule", "TimingBesideChecks", "CheckTally")},
    "host_series": ("thunderfx_debug.recording.host", "host_series"),
    "PeriodicFlush": ("thunderfx_debug.recording.periodic", "PeriodicFlush"),
    "MAX_EVENTS": ("thunderfx_debug.recording.memory", "MAX_EVENTS"),
    "torch_private": ("thunderfx_debug.thunder.torch_private", None),
    "run_script": ("thunderfx_debug.children.standalone", "run_script"),
    "verify": ("thunderfx_debug.commands.verify", None),
    "minimize_script": ("thunderfx_debug.minimize.offline", "minimize_script"),
    "NotAScript": ("thunderfx_debug.minimize.offline", "NotAScript"),
    "NotMinimized": ("thunderfx_debug.minimize.piece", "NotMinimized"),
    "TrialRunner": ("thunderfx_debug.minimize.trials", "TrialRunner"),
    "script_support": ("thunderfx_debug.thunder.script_support", None),
    "OWN_OPTIONS": ("thunderfx_debug.settings.config", "OWN_OPTIONS"),
    "nvfuser_uniform": ("thunderfx_debug.scripts.philox_draws", "nvfuser_uniform"),
}


def __getattr__(name: str) -> Any:
    if name not in HANDED_OUT:
        raise AttributeError(f"module 'internals' hands out no {name!r} (see its docstring)")
    module, attribute = HANDED_OUT[name]
    found = importlib.import_module(module)
    return found if attribute is None else getattr(found, attribute)


def recorded_graphs(backend) -> list:
    """The graphs `backend` (a ReportingBackend) recorded, in the order Dynamo handed them over: each with its split
    module (`split_gm`, its runners in place) and its splits (`splits`: name, and `split` with the compiled piece)."""
    return list(backend.recorder.graphs)


def put_splits(graph, modules: dict) -> None:
    """Puts `modules` (split name -> module: the runners, or the splits they wrap) into a recorded graph's split
    module (`recorded_graphs`), in place of what it calls now."""
    for name, module in modules.items():
        setattr(graph.split_gm, name, module)


def package_module(path: str) -> ModuleType:
    """The package's module at `path` in its folder ("recording/runners.py")."""
    return importlib.import_module("thunderfx_debug." + path.removesuffix(".py").replace("/", "."))


def time_calls(wrapped: Iterable[tuple[str, str | None, str, str]], times: dict[str, list[int]]) -> None:
    """Wraps each function of `wrapped`, (module of `thunderfx_debug.recording`, class or None, function, label), so
    that its calls add their time (ns) and count to `times[label]`, for the rest of the process."""
    for module_name, owner_name, name, label in wrapped:
        module = importlib.import_module(f"thunderfx_debug.recording.{module_name}")
        owner = module if owner_name is None else getattr(module, owner_name)
        function = getattr(owner, name)

        def timed(*args, _function=function, _label=label, **kwargs):
            started = time.perf_counter_ns()
            try:
                return _function(*args, **kwargs)
            finally:
                entry = times[_label]
                entry[0] += time.perf_counter_ns() - started
                entry[1] += 1

        setattr(owner, name, timed)


@contextlib.contextmanager
def keeping_triage_step_lines(into):
    """Within the block, each split's step lines (`results.jsonl`, triage.jobs) are copied into `into`/<its folder's
    name>/ before the triage reads its verdicts and deletes the folder."""
    import shutil
    from pathlib import Path

    from thunderfx_debug.triage import at_flush

    verdicts = at_flush.verdicts

    def copied_first(folder, tried):
        lines = Path(folder) / "results.jsonl"
        if lines.exists():
            (Path(into) / Path(folder).name).mkdir(parents=True, exist_ok=True)
            shutil.copy(lines, Path(into) / Path(folder).name / lines.name)
        return verdicts(folder, tried)

    at_flush.verdicts = copied_first
    try:
        yield
    finally:
        at_flush.verdicts = verdicts


@contextlib.contextmanager
def watching_backward_captures(on_capture: Callable[[str, bool, Any, Any], None]):
    """Within the block, before each backward check judges a split's input gradients, calls `on_capture(input,
    verified, address, captured)` for each input whose gradient it judges: the input as the records name it
    ("graph0/thunder_0 input 3 (l_w_)"), whether the sentinel proved its capture, the address of the input's data as
    the forward had it (`data_ptr`: a parameter's own; None for a value that is not a tensor), and the gradient the
    split passed on to it (None where it passed none). The address is read before the split's backward ends, when the
    check swaps the parameters it keeps for copies of them."""
    import torch

    from thunderfx_debug.recording import split_check

    check, backward_done = split_check.BackwardCheck.check, split_check.BackwardCheck._split_backward_done
    addresses = {}  # id of a BackwardCheck -> input position -> data_ptr before the copies

    def noted(self):
        addresses[id(self)] = {i: x.data_ptr() for i, x in enumerate(self.inputs) if isinstance(x, torch.Tensor)}
        return backward_done(self)

    def watched(self):
        verified = self.verified(list(self.wanted))
        known = addresses.pop(id(self), {})
        for i in self.wanted:
            on_capture(f"{self.owner.label} {self.owner.describe_input(i)}", i in verified, known.get(i),
                       self.captured(i))
        return check(self)

    split_check.BackwardCheck._split_backward_done = noted
    split_check.BackwardCheck.check = watched
    try:
        yield
    finally:
        split_check.BackwardCheck.check = check
        split_check.BackwardCheck._split_backward_done = backward_done
