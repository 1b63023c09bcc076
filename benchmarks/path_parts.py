"""Host time of the training path by part, from profiles of blocks of training steps.

A cProfile profile of steps is read into the parts of ReportingBackend's training path (`PARTS`): each function of
thunderfx_debug counts with the part its module (and class) belongs to, and so does what it calls outside the package
(`torch.cuda.Event`, `Event.record`, `time.perf_counter_ns`, `tree_leaves`, a hook's registration...; `owners`),
except the piece of the model it runs (a split, the split graph: the computation that plain ThunderCompiler runs
too). What the model's own work costs (Thunder, Dynamo, autograd, the optimizer) is "the rest"; `differences` sets
each function's time per step against a baseline profile's (plain ThunderCompiler's), so that a cost the backend
causes outside its own functions shows up as well.

cProfile adds about a microsecond to every call it sees, so the parts' times are upper bounds of their cost in a
run without the profiler; their calls per step, times a call's cost measured alone (`benchmarks/host_overhead.py`),
are the estimate. `torch_profiler_events` reads torch.profiler's CPU-side events (aten ops, CUDA runtime calls such
as cudaEventRecord) per step the same way.

    import cProfile, path_parts
    profile = cProfile.Profile(); profile.enable(); ...steps...; profile.disable()
    parts = path_parts.parts_per_step(profile, steps=10)      # {"graph wrapper": {"us": 3.1, "calls": 1.0}, ...}
"""

from __future__ import annotations

import inspect
import pstats
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import thunderfx_debug

sys.path.insert(0, str(Path(__file__).resolve().parent))
import internals  # noqa: E402

PACKAGE = str(Path(thunderfx_debug.__file__).resolve().parent)

#: The parts of the training path, each as (module path in the package, class names or None for the whole module).
#: A function of the package in none of them counts as "other thunderfx_debug" (a `failures.guard` is counted with
#: its caller's part, see `_OWN_HELPERS`).
PARTS: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "graph wrapper": (("recording/runners.py", ("GraphRunner",)),),
    "split runners": (("recording/runners.py", ("SplitRunner", "ThunderOverhead")),),
    "trace marks": (("recording/timing.py", ("RegionTimer", "Ranges")), ("recording/regions.py", None)),
    "samplers": (("recording/sampler.py", None), ("recording/timing.py", None), ("recording/samples.py", None),
                 ("recording/host.py", None), ("scripts/device_timer.py", None),
                 ("recording/compile_cost.py", None), ("thunder/compile_events.py", None)),
    "memory meter": (("recording/memory.py", None),),
    "input capture": (("recording/capture.py", None),),
    "check": (("recording/check.py", None), ("recording/split_check.py", None), ("recording/region_check.py", None),
              ("recording/isolation.py", None), ("recording/compare.py", None), ("scripts/judging_rule.py", None),
              ("recording/piece_facts.py", None), ("thunder/reference.py", None)),
    "periodic flush trigger": (("recording/periodic.py", None),),
}
#: Package helpers whose time belongs to whoever called them.
_OWN_HELPERS = ("safety.py",)
#: Package modules that plain ThunderCompiler runs too (the lazily compiled inductor fallback of
#: `plain_thunder_compiler(lazy_inductor_fallback=True)`): the model's work, as Thunder's is.
_PLAIN_TOO = ("thunder/workarounds.py", "thunder/script_support.py")
#: Callees outside the package that run the model's work, not the backend's: never counted in a part.
_COMPUTATION = ("torch/nn/modules/module.py", "torch/fx/graph_module.py", "/thunder/", "torch/_dynamo/",
                "torch/autograd/function.py", "torch/_functorch/", "torch/_inductor/")
OTHER = "other thunderfx_debug"


def _relative(filename: str) -> str | None:
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return None
    return resolved[len(PACKAGE) + 1:] if resolved.startswith(PACKAGE + "/") else None


def _class_lines(module_path: str) -> dict[int, str]:
    """First line of every function and method of a package module -> the class it belongs to ("" for none)."""
    name = "thunderfx_debug." + module_path.removesuffix(".py").replace("/", ".")
    module = internals.package_module(module_path)
    lines: dict[int, str] = {}
    for attribute in vars(module).values():
        if inspect.isclass(attribute) and attribute.__module__ == name:
            for member in vars(attribute).values():
                function = getattr(member, "__func__", member)
                function = getattr(function, "fget", function)
                code = getattr(function, "__code__", None)
                if code is not None:
                    lines[code.co_firstlineno] = attribute.__name__
                    for constant in code.co_consts:  # closures and lambdas defined in a method
                        if inspect.iscode(constant):
                            lines[constant.co_firstlineno] = attribute.__name__
    return lines


class Classifier:
    """Which part a profiled function (pstats' (filename, line, name) key) belongs to: a part's name, OTHER for the
    rest of the package, `None` outside it."""

    def __init__(self):
        self._lines: dict[str, dict[int, str]] = {}
        self._cache: dict[tuple, str | None] = {}

    def part(self, key: tuple[str, int, str]) -> str | None:
        found = self._cache.get(key, "?")
        if found != "?":
            return found
        found = self._classify(key)
        self._cache[key] = found
        return found

    def _classify(self, key: tuple[str, int, str]) -> str | None:
        filename, line, _ = key
        relative = _relative(filename)
        if relative is None or relative in _PLAIN_TOO:
            return None
        if relative.endswith(_OWN_HELPERS):
            return "helper"
        for part, places in PARTS.items():
            for module, classes in places:
                if relative != module:
                    continue
                if classes is None:
                    return part
                if module not in self._lines:
                    self._lines[module] = _class_lines(module)
                if self._lines[module].get(line) in classes:
                    return part
        return OTHER


def _is_computation(key: tuple[str, int, str]) -> bool:
    filename = key[0].replace("\\", "/")
    if _relative(key[0]) in _PLAIN_TOO:
        return True
    return any(marker in filename for marker in _COMPUTATION) or filename.startswith("<eval_with_key>")


def owners(stats: dict, classifier: Classifier) -> dict[tuple, dict[str | None, float]]:
    """Per profiled function, the shares of its own time that belong to each part (None: to no part). A function of
    a part belongs to it; the model's work (Thunder, Dynamo, torch.nn's call machinery, the split graph) to none;
    any other function to whoever called it, in proportion to the time spent in it under each caller, as far as
    cProfile's one level of callers tells (`torch.cuda.Event` under a sampler is the sampler's; `contextlib`'s
    `__enter__` of a `failures.guard`, and the guard, are their caller's)."""
    fixed: dict[tuple, dict[str | None, float]] = {}
    for key in stats:
        part = classifier.part(key)
        if part not in (None, "helper"):
            fixed[key] = {part: 1.0}
        elif part is None and _is_computation(key):
            fixed[key] = {None: 1.0}
    share = {key: fixed.get(key, {None: 1.0}) for key in stats}
    for _ in range(64):  # deep enough for any chain of plain functions under a part; stops when nothing moves
        moved = False
        for key, (_, _, _, _, callers) in stats.items():
            if key in fixed or not callers:
                continue
            weights: dict[str | None, float] = {}
            by_time = sum(ct for (_, _, _, ct) in callers.values()) > 0
            for caller, (_, calls, _, ct) in callers.items():
                weight = ct if by_time else calls
                for part, fraction in share.get(caller, {None: 1.0}).items():
                    weights[part] = weights.get(part, 0.0) + weight * fraction
            total = sum(weights.values())
            new = {part: w / total for part, w in weights.items()} if total > 0 else {None: 1.0}
            if any(abs(new.get(p, 0.0) - share[key].get(p, 0.0)) > 1e-9 for p in set(new) | set(share[key])):
                share[key], moved = new, True
        if not moved:
            break
    return share


def parts_per_step(profile, steps: int, classifier: Classifier | None = None) -> dict[str, dict[str, float]]:
    """Per part, microseconds per step of the time it owns (`owners`) and calls per step of its own functions
    ("us", "calls"), and "total" (everything the profile saw per step) and "rest" (what no part owns: the model's
    work and the framework's)."""
    classifier = classifier or Classifier()
    stats = _stats(profile).stats
    result = {part: {"us": 0.0, "calls": 0.0} for part in (*PARTS, OTHER)}
    share = owners(stats, classifier)
    total = 0.0
    for key, (_, calls, tottime, _, _) in stats.items():
        total += tottime
        for part, fraction in share[key].items():
            if part is not None:
                result[part]["us"] += tottime * fraction * 1e6
        part = classifier.part(key)
        if part in result:
            result[part]["calls"] += calls
    ours = sum(figures["us"] for figures in result.values()) / 1e6
    for figures in result.values():
        figures["us"] /= steps
        figures["calls"] /= steps
    result["total"] = {"us": total * 1e6 / steps, "calls": 0.0}
    result["rest"] = {"us": (total - ours) * 1e6 / steps, "calls": 0.0}
    return result


_NUMBERED = re.compile(r"(\d+)(?=[>.]|$)")


def function_name(key: tuple[str, int, str]) -> str:
    """A profiled function's name across compiled copies: generated files numbered per copy
    ("<eval_with_key>.12", "thunder.computation_7") lose their numbers, and their functions their lines."""
    filename, line, name = key
    generated = filename.startswith("<") or not Path(filename).suffix == ".py"
    if generated:
        return f"{_NUMBERED.sub('N', filename)}:{_NUMBERED.sub('N', name)}"
    relative = _relative(filename)
    shown = f"thunderfx_debug/{relative}" if relative else "/".join(Path(filename).parts[-3:])
    return f"{shown}:{line}:{name}"


def part_functions(profile, steps: int, classifier: Classifier | None = None,
                   top: int = 8) -> dict[str, list[dict]]:
    """Per part, its costliest functions of the package: own microseconds and calls per step."""
    classifier = classifier or Classifier()
    found: dict[str, list[dict]] = {}
    for key, (_, calls, tottime, _, _) in _stats(profile).stats.items():
        part = classifier.part(key)
        if part not in (None, "helper"):
            found.setdefault(part, []).append({"function": function_name(key), "us": tottime * 1e6 / steps,
                                               "calls": calls / steps})
    return {part: sorted(rows, key=lambda row: -row["us"])[:top] for part, rows in found.items()}


def functions_per_step(profile, steps: int) -> dict[str, tuple[float, float]]:
    """Function name (`function_name`) -> (own microseconds per step, calls per step)."""
    found: dict[str, list[float]] = {}
    for key, (_, calls, tottime, _, _) in _stats(profile).stats.items():
        entry = found.setdefault(function_name(key), [0.0, 0.0])
        entry[0] += tottime * 1e6 / steps
        entry[1] += calls / steps
    return {name: (us, calls) for name, (us, calls) in found.items()}


def differences(functions: dict[str, tuple[float, float]], baseline: dict[str, tuple[float, float]],
                top: int = 25) -> list[dict]:
    """The `top` functions whose own time per step differs most from the baseline's (either way), with their calls
    per step in both."""
    names = set(functions) | set(baseline)
    rows = []
    for name in names:
        us, calls = functions.get(name, (0.0, 0.0))
        base_us, base_calls = baseline.get(name, (0.0, 0.0))
        rows.append({"function": name, "us": us, "baseline_us": base_us, "difference_us": us - base_us,
                     "calls": calls, "baseline_calls": base_calls})
    rows.sort(key=lambda row: abs(row["difference_us"]), reverse=True)
    return rows[:top]


def torch_profiler_events(profiler, steps: int) -> dict[str, tuple[float, float]]:
    """torch.profiler's events by name -> (self CPU microseconds per step, count per step)."""
    found = {}
    for event in profiler.key_averages():
        found[event.key] = (event.self_cpu_time_total / steps, event.count / steps)
    return found


def event_differences(events: dict[str, tuple[float, float]], baseline: dict[str, tuple[float, float]],
                      top: int = 25) -> list[dict]:
    """As `differences`, for torch.profiler's events; an event whose count per step differs comes first."""
    rows = differences(events, baseline, top=len(set(events) | set(baseline)))
    for row in rows:
        row["event"] = row.pop("function")
    rows.sort(key=lambda row: (abs(row["calls"] - row["baseline_calls"]) < 1e-9, -abs(row["difference_us"])))
    return rows[:top]


def _stats(profile) -> pstats.Stats:
    return profile if isinstance(profile, pstats.Stats) else pstats.Stats(profile)


def merged(profiles: Iterable) -> pstats.Stats | None:
    """One pstats.Stats of several profiles (None for none)."""
    profiles = list(profiles)
    if not profiles:
        return None
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    return stats
