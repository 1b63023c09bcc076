"""The benchmark scripts' own logic on CPU, with real Thunder runs: what they match, check and refuse. Their figures
come from the H200 (benchmarks/RESULTS.md); nothing here is timed. And what they take of the package: its public
names, the rest through benchmarks/internals.py only."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _load(script: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script}", BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fidelity_benchmark_matches_every_region_to_its_profiler_range(tmp_path):
    """benchmarks/fidelity.py --tiny on CPU: the matching of regions to profiler ranges, not the figures."""
    fidelity = _load("fidelity")
    assert fidelity.main(["--tiny", "--warmup", "2", "--steps", "2", "--json", str(tmp_path / "f.json")]) == 0
    data = json.loads((tmp_path / "f.json").read_text())["results"]
    assert data["summary"]["regions"] >= 2
    assert data["summary"]["matched_regions"] == data["summary"]["regions"]
    assert all(r["backend_samples"] == r["profiler_samples"] == 2 for r in data["regions"])
    cost = data["summary"]["bracket_cost_ms"]
    assert cost >= 0 and all(r["net_backend_median_ms"] == pytest.approx(max(r["backend_median_ms"] - cost, 0.0))
                             for r in data["regions"])


def test_fidelity_step_mode_attributes_every_profiled_step_part_by_part(tmp_path):
    """benchmarks/fidelity.py --tiny --step on CPU: the bookkeeping of the whole-step attribution (the Llama mode on
    the H200 is the same code with --model llama), not its figures."""
    fidelity = _load("fidelity")
    assert fidelity.main(["--tiny", "--step", "--warmup", "2", "--steps", "2", "--json", str(tmp_path / "s.json")]) == 0
    data = json.loads((tmp_path / "s.json").read_text())["results"]
    assert len(data["steps"]) == 2
    for step in data["steps"]:
        parts = sum(step[k] for k in ("fusion regions", "ops outside regions", "inductor splits", "Thunder between ops",
                                      "Thunder outside its traces", "between splits"))
        assert parts == pytest.approx(step["graphs"]) and step["fusion regions"] > 0 and step["kernels"] > 0
    assert data["summary"]["ratio"] is not None


def test_overhead_refuses_an_unknown_executor_before_any_model_is_built(capsys):
    overhead = _load("overhead")
    with pytest.raises(SystemExit) as exit_info:
        overhead.parse_args(["--device", "cpu", "--executors", "torchcompile,nvfuserr"])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "unknown executor nvfuserr" in message and "torchcompile" in message.split("Thunder has")[1]


def test_overhead_knows_which_steps_sample_and_check_as_the_backend_does():
    """The profile files each step under ordinary or sampled/checked by the backend's own schedules."""
    overhead = _load("overhead")
    from thunderfx_debug import ReportingBackend

    kinds = overhead.special_steps(ReportingBackend(check="fusion", check_every=5, timing_every=5, timing_warmup=0))
    assert [kinds(step) for step in range(1, 8)] == ["checked", "sampled", "", "", "", "checked", "sampled"]
    assert overhead.special_steps(object())(6) == ""  # plain ThunderCompiler samples nothing


@pytest.mark.slow
def test_overhead_measures_and_profiles_every_configuration_against_plain_in_one_process(tmp_path):
    """A whole tiny run on CPU: the backends' first losses equal plain ThunderCompiler's, the rounds are paired, and
    the profile finds each part of the path where the configuration has it, and none of it in plain's steps."""
    out = tmp_path / "overhead.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "overhead.py"), "--device", "cpu", "--warmup", "2",
                           "--rounds", "3", "--block", "2", "--every", "3", "--configurations",
                           "defaults,check=fusion,timing=fusion", "--profile", "--profile-rounds", "1",
                           "--profile-block", "3", "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/overhead.py --device cpu") and record["versions"]["torch"]
    llama = record["results"]["models"]["llama"]
    assert llama["first_losses"]["equal_to_plain"] == {"defaults": True, "check=fusion": True, "timing=fusion": True}
    measured = llama["measurement"]
    assert measured["rounds"] == 3
    for name in ("defaults", "check=fusion", "timing=fusion"):
        row = measured["configurations"][name]
        assert row["measured_steps"] == 6 and len(row["block_ms"]) == 3
        assert row["amortised_ratio"]["low"] <= row["amortised_ratio"]["ratio"] <= row["amortised_ratio"]["high"]
    assert measured["configurations"]["check=fusion"]["checked_steps"] == 2  # calls 13 and 16 of 11-16
    costs = measured["check_costs"]  # what the checks were charged: their blocks only, at the default share of 100
    assert costs["splits"] == len(measured["configurations"]["check=fusion"]["split_checks"])
    assert costs["blocks_ms"] > 0 and costs["beyond_blocks_ms"] == 0
    profiled = llama["profile"]
    splits = sum(llama["splits"]["splits_per_graph"])
    assert not any(profiled["plain"]["ordinary_step"][part]["calls"] for part in ("graph wrapper", "split runners"))
    for name in ("defaults", "check=fusion", "timing=fusion"):
        ordinary = profiled[name]["ordinary_step"]
        assert ordinary["graph wrapper"]["calls"] >= 1 and ordinary["split runners"]["calls"] >= splits
    assert profiled["timing=fusion"]["ordinary_step"]["trace marks"]["calls"] > 0
    assert profiled["check=fusion"]["ordinary_step"]["check"]["calls"] > 0
    assert profiled["check=fusion"]["special_step"]["check"]["us"] > profiled["check=fusion"]["ordinary_step"][
        "check"]["us"]


def test_path_parts_files_the_runners_functions_under_their_parts():
    """What the profile's parts hold: the graph runner's and the split runner's methods, the periodic trigger, the
    trace marks; Thunder's and torch's functions in none of them."""
    path_parts = _load("path_parts")
    import torch

    from thunderfx_debug.recording import memory, periodic, runners, timing

    classifier = path_parts.Classifier()

    def key(function):
        code = function.__code__
        return (code.co_filename, code.co_firstlineno, code.co_name)

    assert classifier.part(key(runners.GraphRunner.__call__)) == "graph wrapper"
    assert classifier.part(key(runners.SplitRunner.forward)) == "split runners"
    assert classifier.part(key(timing.RegionTimer.mark_op)) == "trace marks"
    assert classifier.part(key(timing.Sampling.is_sampled)) == "samplers"
    assert classifier.part(key(periodic.PeriodicFlush.fire)) == "periodic flush trigger"
    assert classifier.part(key(memory.MemoryMeter.run)) == "memory meter"
    assert classifier.part(key(torch.nn.Module._call_impl)) is None


def test_real_models_reports_the_exception_line_of_a_failed_mode_not_its_last_line():
    """The H200's Llama under plain ThunderCompiler: torch ends the message with a line of advice, which the table
    printed instead of the error until this test."""
    real_models = _load("real_models")
    stderr = "\n".join([
        "Traceback (most recent call last):",
        '  File "real_models.py", line 120, in _child',
        "torch._dynamo.exc.BackendCompilerFailed: backend='ReportingBackend' raised:",
        "AssertionError: expected size 4==4, stride 4096==32 at dim=1",
        "This error most often comes from a incorrect fake (aka meta) kernel for a custom op.",
        "Use torch.library.opcheck to test your custom op.",
        "See https://pytorch.org/docs/stable/library.html#torch.library.opcheck",
    ])
    assert real_models.error_line(stderr) == "AssertionError: expected size 4==4, stride 4096==32 at dim=1"
    assert real_models.error_line("Segmentation fault\n") == "Segmentation fault"
    assert real_models.error_line("") == "no output"


def test_flush_pause_benchmark_classifies_steps_by_the_flushes_they_overlap():
    """benchmarks/flush_pause.py's arithmetic on made-up flushes and steps (its training run is the H200's)."""
    flush_pause = _load("flush_pause")
    from thunderfx_debug.run.flusher import FlushStats

    history = [FlushStats("periodic", 900.0, 50.0, 9, 0, started_s=0.0),  # the first: makes every script
               FlushStats("periodic", 2.0, 98.0, 4, 5, started_s=10.0), FlushStats("periodic", 4.0, 96.0, 4, 5,
                                                                                    started_s=20.0)]
    steps = [(1.0, 1.010), (5.0, 5.012), (10.05, 10.075), (20.09, 20.13), (30.0, 30.011)]  # seconds
    result = flush_pause.summarise({"history": history, "steps_times": steps})
    assert result["first_flush"]["training_thread_ms"] == 900.0 and result["flushes_measured"] == 2
    assert result["pause_ms"]["median"] == 3.0 and result["pause_ms"]["worst"] == 4.0
    assert result["step_ms"]["median_without_flush"] == pytest.approx(11.0)  # the steps at 1, 5 and 30 s
    assert result["step_ms"]["steps_overlapping_a_flush"] == 2
    assert result["step_ms"]["excess_worst"] == pytest.approx(29.0)
    assert flush_pause.check_cost_ns(rounds=1, calls=1000)["ns_per_call_with"] > 0


def test_harness_pairs_each_block_with_the_baseline_block_of_its_round():
    harness = _load("harness")
    ratios = harness.paired_ratios({"off": [10.0, 20.0, 10.0], "split": [10.5, 20.0, 11.0],
                                    "fusion": [12.0, 22.0, 10.0]}, "off")
    assert ratios["split"]["per_round"] == [1.05, 1.0, 1.1]
    assert (ratios["split"]["median"], ratios["split"]["min"], ratios["split"]["max"]) == (1.05, 1.0, 1.1)
    assert ratios["fusion"]["median"] == pytest.approx(1.1) and "off" not in ratios


def test_check_sentinel_refuses_steps_that_are_not_whole_blocks(capsys):
    check_sentinel = _load("check_sentinel")
    with pytest.raises(SystemExit) as exit_info:
        check_sentinel.parse_args(["--steps", "120", "--block", "50"])
    assert exit_info.value.code == 2 and "must be a multiple of --block" in capsys.readouterr().err
    args = check_sentinel.parse_args(["--every", "25"])
    assert (args.block, args.steps, args.cost_layers) == (25, 300, 12)  # a block holds one checked call


def test_sentinel_zoo_maps_verdicts_to_parameters_and_says_what_failed():
    """benchmarks/sentinel_zoo.py's bookkeeping (the runs themselves: RESULTS.md): Dynamo's names of lifted parameters
    back to the model's, and the verdicts that make the run fail."""
    zoo = _load("sentinel_zoo")
    assert zoo._parameter_name("gradient of input 6 (l_self_modules_transformer_modules_h_modules_0_modules_ln_1_"
                               "parameters_weight_)") == "transformer.h.0.ln_1.weight"
    assert zoo._parameter_name("gradient of input 8 (l_args_0_modules_model_modules_layers_modules_0_modules_"
                               "input_layernorm_parameters_weight_)") == "model.layers.0.input_layernorm.weight"
    assert zoo._parameter_name("forward output 0") is None
    args = zoo.parse_args(["--device", "cpu", "--expect-oob", "graph0/thunder_0/nvFusion0_forward"])
    same = {"loss_bits": ["0x1.8p+1"], "parameters_sha256": "ab", "losses": [3.0]}
    other = {"loss_bits": ["0x1.8p+1"], "parameters_sha256": "cd", "losses": [3.0]}
    results = {"grads": {"gpt2": {"false_mismatches": ["graph0/thunder_2"]}, "llama": {"false_mismatches": []}},
               "oob": {"sentinel": {"mismatching": ["graph0/thunder_0"]}},
               "identity": {"llama": {"off": same, "off_again": same, "fusion": other},
                            "bert": {"off": same, "off_again": same, "fusion": same}},
               "cost": {"error": "out of time after 150 s (--deadline)"}}
    verdicts = zoo._verdicts(results, args)
    assert not verdicts["ok"] and len(verdicts["problems"]) == 4 and not verdicts["not_judged"]
    assert any("gpt2: false MISMATCH" in p for p in verdicts["problems"])
    assert any("nvFusion0_forward not flagged" in p for p in verdicts["problems"])
    assert any("identity llama: CHECK=fusion changed the training" in p for p in verdicts["problems"])
    assert any(p.startswith("cost: out of time") for p in verdicts["problems"])


def test_sentinel_zoo_calls_a_model_whose_check_off_runs_differ_nondeterministic_not_changed_by_the_check():
    """The H200's gpt2-dropout: the check-off runs differ from each other at step 4, the checked run equals one of
    them. That is the model's own nondeterminism, not judged; the check alters the training only where the two
    check-off runs agree and the checked run differs."""
    zoo = _load("sentinel_zoo")
    args = zoo.parse_args(["--device", "cpu"])

    def run(last_bits: str, sha: str) -> dict:
        return {"loss_bits": ["0x1.2p+3", "0x1.1p+3", "0x1.0p+3", last_bits], "parameters_sha256": sha,
                "losses": [9.0, 8.5, 8.0, float.fromhex(last_bits)]}

    a, b = run("0x1.181a1p+3", "bfd4cd31"), run("0x1.1818ep+3", "d0d06cc3")
    results = {"identity": {"gpt2-dropout": {"off": a, "off_again": b, "fusion": dict(b)}}}
    verdict = zoo.identity_verdict(results["identity"]["gpt2-dropout"])
    assert verdict == {"verdict": "nondeterministic without the check", "step": 4, "fusion_equals": ["off_again"]}
    verdicts = zoo._verdicts(results, args)
    assert verdicts["ok"] and not verdicts["problems"]
    assert len(verdicts["not_judged"]) == 1 and "nondeterministic without the check" in verdicts["not_judged"][0]
    assert "from step 4" in verdicts["not_judged"][0] and "CHECK=fusion changed" not in verdicts["not_judged"][0]
    # the control agrees and the checked run differs: the check altered the training
    changed = zoo.identity_verdict({"off": a, "off_again": dict(a), "fusion": b})
    assert changed == {"verdict": "CHECK=fusion changed the training", "step": 4, "fusion_equals": []}
    assert zoo.identity_verdict({"off": a, "off_again": dict(a), "fusion": {"error": "out of time"}})["verdict"] == "error"


def test_host_overhead_predicts_a_models_step_ratio_from_its_fit_and_the_models_graphs_and_splits():
    """host_overhead.py --predict: the fit per graph call and per split times an overhead.py record's graphs and
    splits, over plain ThunderCompiler's step there, beside the ratio measured there."""
    host_overhead = _load("host_overhead")
    figures = {"fit_above_plain": {"thunderfx": {"per_graph_call_us": 0.0, "per_split_us": 0.0},
                                   "defaults": {"per_graph_call_us": 4.0, "per_split_us": 2.0}}}
    record = {"results": {"models": {"llama": {
        "splits": {"graphs": 2, "splits_per_graph": [5, 3]},
        "measurement": {"configurations": {"plain": {"mean_step_ms": 10.0},
                                           "defaults": {"amortised_ratio": {"ratio": 1.01, "low": 1.0,
                                                                            "high": 1.02}}}}}}}}
    predicted = host_overhead.predict(figures, record)["llama"]
    assert (predicted["graphs"], predicted["splits"], predicted["plain_step_ms"]) == (2, 8, 10.0)
    row = predicted["configurations"]["defaults"]
    assert row["host_us_per_step"] == 2 * 4.0 + 8 * 2.0
    assert row["predicted_ratio"] == pytest.approx(1 + 24.0 / 10_000)
    assert (row["measured_ratio"], row["measured_interval"]) == (1.01, [1.0, 1.02])


def test_path_parts_gives_the_wrapper_its_own_time_and_the_model_the_rest():
    """A profile of a graph runner around a torch module: the runner's time is the graph wrapper's, one call per
    step, the module's (the model's work) is the rest, and the parts and the rest add up to the whole."""
    import cProfile
    from types import SimpleNamespace

    import torch

    from thunderfx_debug.recording.host import host_series
    from thunderfx_debug.recording.runners import GraphRunner
    from thunderfx_debug.recording.timing import Sampling

    path_parts = _load("path_parts")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    state = SimpleNamespace(calls=0, name="graph0", failed_split=None, period=host_series())
    runner = GraphRunner(state, model, Sampling(50, 5, enabled=False), None, None, on_error=None)
    x = torch.ones(2, 4)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(100):
        runner(x)
    profile.disable()
    parts = path_parts.parts_per_step(profile, steps=100)
    assert parts["graph wrapper"]["calls"] == pytest.approx(1.0, abs=0.05)  # __call__, and the first call's four
    assert parts["graph wrapper"]["us"] > 0 and parts["split runners"]["calls"] == 0
    assert parts["rest"]["us"] > parts["graph wrapper"]["us"]  # the Linear and the ReLU
    owned = sum(figures["us"] for name, figures in parts.items() if name not in ("rest", "total"))
    assert owned + parts["rest"]["us"] == pytest.approx(parts["total"]["us"])


def test_host_overhead_times_the_runners_alone_with_and_without_the_sentinels_schedule():
    """host_overhead.py --runners: both schedules, both graph sizes, and the fit through them (no figure judged)."""
    host_overhead = _load("host_overhead")
    figures = host_overhead.runners_alone(rounds=1, calls=50)
    assert set(figures["runners"]) == {"timed", "with the sentinel's schedule"}
    for row in figures["runners"].values():
        assert set(row["ns_above_bare"]) == set(host_overhead.SPLIT_COUNTS)
        low, high = host_overhead.SPLIT_COUNTS
        assert row["per_split_ns"] == pytest.approx((row["ns_above_bare"][high] - row["ns_above_bare"][low])
                                                    / (high - low))


@pytest.fixture(scope="module")
def sampled_step_parts(tmp_path_factory) -> dict:
    """benchmarks/sampled_step_parts.py on the tiny Llama, timed at fusion level and checked every 50 calls (one
    run for the tests below: a fresh process, its wrappers around the functions the calls run)."""
    out = tmp_path_factory.mktemp("parts") / "parts.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "sampled_step_parts.py"), "--timing", "fusion", "--check",
                    "fusion", "--check-every", "50", "--steps", "100", "--json", str(out)], check=True,
                   capture_output=True, text=True, timeout=600)
    return json.loads(out.read_text())["results"]


def test_sampled_step_parts_tells_sampled_steps_that_measure_memory_from_those_that_do_not(sampled_step_parts):
    """Sampled calls 56 (the second: memory measured) and 106 (the third: timed only), each with its parts, the
    region timers' among them."""
    results = sampled_step_parts
    sampled = {s["call"]: s for s in results["sampled_steps"]}
    assert sorted(sampled) == [56, 106] and sampled[56]["memory"] and not sampled[106]["memory"]
    with_memory = results["parts_us_mean_sampled_with_memory"]
    assert {"saved-tensor hooks on", "autograd walk and hooks (memory)", "autograd walk and hooks (sampler)",
            "memory backward end hook (reads the step)", "sampler backward end hook"} <= set(with_memory)
    without_memory = results["parts_us_mean_sampled_without_memory"]
    assert {"autograd walk and hooks (sampler)", "sampler backward end hook", "region and op marks", "reading earlier traces' marks",
            "storing a trace's samples (inside the above)"} <= set(without_memory)
    assert "saved-tensor hooks on" not in without_memory


def test_sampled_step_parts_times_a_checked_steps_parts_with_the_check_on(sampled_step_parts):
    """--check fusion: the checked calls (1 + 50k, after the warm-up of 8) are listed with their checks' parts."""
    results = sampled_step_parts
    assert [s["call"] for s in results["checked_steps"]] == [51, 101]
    assert {"region references and judging", "split forward check",
            "split backward check"} <= set(results["parts_us_mean_checked"])


# ---- the benchmarks and the package's public names ----------------------------------------------------------------

#: The package's public modules besides its own names (`thunderfx_debug.__all__`), each with its submodules, as
#: docs/architecture.md ("The public names") defines them; in them, a name that starts with "_" is not public.
PUBLIC_MODULES = ("thunderfx_debug.records", "thunderfx_debug.render", "thunderfx_debug.commands.models")
#: Modules under a public one that are not public.
NOT_PUBLIC = ("thunderfx_debug.render.progress",)
#: The one benchmark module that hands the package's inside to the benchmarks that measure it.
INTERNALS = "internals"
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _public(dotted: str) -> bool:
    """Whether `dotted` ("thunderfx_debug.render.memory.render_memory") is a public name of the package, or no name
    of the package at all."""
    import thunderfx_debug

    parts = dotted.split(".")
    if parts[0] != "thunderfx_debug" or len(parts) == 1:
        return True
    if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]):
        return False
    if parts[1] in thunderfx_debug.__all__ or parts[1].startswith("__"):  # a module's own __file__, __name__
        return True
    if any(dotted == m or dotted.startswith(f"{m}.") for m in NOT_PUBLIC):
        return False
    return any(dotted == m or dotted.startswith(f"{m}.") for m in PUBLIC_MODULES)


def _chain(node: ast.AST) -> tuple[ast.Name | None, list[str], bool]:
    """The name an expression such as `a.b(c)[0].d` starts from, its attributes after that name up to the first call
    or subscript, and whether it is attributes only (`a.b.d`: a module, a class, a function as imported)."""
    attributes, pure = [], True
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        else:
            attributes, pure = [], False
            node = node.func if isinstance(node, ast.Call) else node.value
    return (node if isinstance(node, ast.Name) else None), list(reversed(attributes)), pure


class _Scope:
    """The names of one function (or class, or the module) that hold something of the package: `imported` (name ->
    the dotted path it was imported as, from the package or from benchmarks/internals.py) and `made` (names bound to
    what an expression over such names gave: a backend, a runner, a module picked from a dict of them)."""

    def __init__(self, node: ast.AST, parent: _Scope | None):
        self.node, self.parent = node, parent
        self.imported: dict[str, str] = {}
        self.made: set[str] = set()
        self.local: set[str] = set()

    def own_nodes(self):
        """The nodes of this scope, not those of the functions and classes inside it (their names are its own)."""
        stack = list(ast.iter_child_nodes(self.node))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, _SCOPES):
                stack.extend(ast.iter_child_nodes(node))

    def origin(self, name: str) -> str | None:
        """"imported:<path>", "made", or None for a name that holds nothing of the package."""
        if name in self.local:
            if name in self.imported:
                return f"imported:{self.imported[name]}"
            return "made" if name in self.made else None
        return self.parent.origin(name) if self.parent is not None else None

    def bind(self) -> None:
        bindings = []  # (target, value): the names of the target hold what the value gave
        for node in self.own_nodes():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.partition(".")[0] in ("thunderfx_debug", INTERNALS):
                        name = alias.asname or alias.name.partition(".")[0]
                        self.imported[name] = alias.name if alias.asname else name
                    self.local.add(alias.asname or alias.name.partition(".")[0])
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (node.module or "").partition(".")[0] in ("thunderfx_debug", INTERNALS) and not node.level:
                        self.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    self.local.add(alias.asname or alias.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.local.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.local.add(node.id)
            elif isinstance(node, ast.Assign):
                bindings += [(target, node.value) for target in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                bindings.append((node.target, node.value))
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                bindings.append((node.target, node.iter))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                bindings.append((node.optional_vars, node.context_expr))
        changed = True
        while changed:
            changed = False
            for target, value in bindings:
                if self.holds_package(value):
                    names = {n.id for n in ast.walk(target)
                             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - self.made
                    self.made |= names
                    changed = changed or bool(names)

    def holds_package(self, expression: ast.AST) -> bool:
        return any(self.origin(n.id) for n in ast.walk(expression) if isinstance(n, ast.Name))


def _reaches(source: str) -> list[str]:
    """Where a benchmark's source goes past the package's public names: "line: what" for every import (inside
    functions too, and by `importlib.import_module` or `__import__`) of a name that is not public, every attribute
    read through an imported module of the package that is not public, every assignment (or `setattr`, `delattr`,
    `del`) to an attribute of the package's modules, classes and functions as imported (a patch of the package), and
    to an attribute whose name starts with "_" of an object made from them."""
    tree = ast.parse(source)
    scopes = []

    def make(node: ast.AST, parent: _Scope | None) -> None:
        scope = _Scope(node, parent)
        scope.bind()
        scopes.append(scope)
        for child in scope.own_nodes():
            if isinstance(child, _SCOPES):
                make(child, scope)

    make(tree, None)
    found = []

    def patched(scope: _Scope, line: int, target: ast.AST, attribute: str | None) -> None:
        root, attributes, pure = _chain(target)
        origin = scope.origin(root.id) if root is not None else None
        if origin is None:
            return
        what = f"{ast.unparse(target)}.{attribute or '<computed>'}"
        if pure and origin.startswith("imported:"):
            found.append(f"{line}: assigns {what}, which patches the package")
        elif attribute is None or attribute.startswith("_"):
            found.append(f"{line}: assigns {what}, a private attribute of an object of the package")

    for scope in scopes:
        inner = {id(n.value) for n in scope.own_nodes() if isinstance(n, ast.Attribute)}
        for node in scope.own_nodes():
            if isinstance(node, ast.Import):
                found += [f"{node.lineno}: imports {a.name}, which is not public" for a in node.names
                          if not _public(a.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found += [f"{node.lineno}: imports {node.module}.{a.name}, which is not public" for a in node.names
                          if not _public(f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in inner:
                root, attributes, pure = _chain(node)
                origin = scope.origin(root.id) if root is not None else None
                imported = origin.removeprefix("imported:") if origin is not None else ""
                if pure and imported.startswith("thunderfx_debug") and _public(imported):  # else its import is found
                    dotted = ".".join([imported, *attributes])
                    if not _public(dotted):
                        found.append(f"{node.lineno}: reads {dotted}, which is not public")
            elif isinstance(node, ast.Call):
                root, attributes, _ = _chain(node.func)
                name = ".".join([root.id, *attributes]) if root is not None else ""
                if name in ("importlib.import_module", "__import__", "import_module") and node.args:
                    module = node.args[0]
                    if not (isinstance(module, ast.Constant) and isinstance(module.value, str)):
                        found.append(f"{node.lineno}: imports a module by a name computed at run time")
                    elif not _public(module.value):
                        found.append(f"{node.lineno}: imports {module.value}, which is not public")
                elif name in ("setattr", "delattr") and len(node.args) >= 2:
                    attribute = node.args[1]
                    patched(scope, node.lineno, node.args[0], attribute.value if isinstance(attribute, ast.Constant)
                            and isinstance(attribute.value, str) else None)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Attribute) and not isinstance(part.ctx, ast.Load):
                            patched(scope, node.lineno, part.value, part.attr)
    return sorted(set(found), key=lambda f: (int(f.partition(":")[0]), f))


def test_benchmarks_import_only_the_public_names_of_the_package_and_patch_none_of_it():
    """Every benchmark but benchmarks/internals.py reads the package through its public names only (see
    docs/architecture.md, "The public names"), and none patches it; what measures the package's inside takes it from
    benchmarks/internals.py, which says why."""
    found = {path.name: _reaches(path.read_text()) for path in sorted(BENCHMARKS.glob("*.py"))
             if path.stem != INTERNALS}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_public_names_check_finds_deferred_imports_reads_and_patches():
    # The test above must be able to fail, on each kind of reach.
    source = ("import importlib\nimport thunderfx_debug\nfrom thunderfx_debug import load_report, Report\n"
              "from thunderfx_debug.render import memory, progress\nfrom thunderfx_debug.commands.models import GPT\n"
              "import internals\n"
              "def f(name):\n"
              "    from thunderfx_debug.recording.timing import CudaClock\n"
              "    import thunderfx_debug.recording.split_check as split_check\n"
              "    thunderfx_debug.records.SourceLine, thunderfx_debug.run.backend, memory._private\n"
              "    importlib.import_module('thunderfx_debug.minimize.trials'), importlib.import_module(name)\n"
              "    split_check.BackwardCheck.check = print\n"
              "    setattr(internals.split_check.BackwardCheck, 'check', print)\n"
              "    model = GPT(None)\n"
              "    model.blocks[0]._hooks = {}\n"
              "    model.head.weight = None\n"
              "    owners = {'memory': internals.memory}\n"
              "    for owner in owners.values():\n"
              "        setattr(owner, name, print)\n"
              "    config = object()\n"
              "    config._attn_implementation = 'eager'\n")
    assert _reaches(source) == [
        "4: imports thunderfx_debug.render.progress, which is not public",
        "8: imports thunderfx_debug.recording.timing.CudaClock, which is not public",
        "9: imports thunderfx_debug.recording.split_check, which is not public",
        "10: reads thunderfx_debug.render.memory._private, which is not public",
        "10: reads thunderfx_debug.run.backend, which is not public",
        "11: imports a module by a name computed at run time",
        "11: imports thunderfx_debug.minimize.trials, which is not public",
        "12: assigns split_check.BackwardCheck.check, which patches the package",
        "13: assigns internals.split_check.BackwardCheck.check, which patches the package",
        "15: assigns model.blocks[0]._hooks, a private attribute of an object of the package",
        "19: assigns owner.<computed>, a private attribute of an object of the package",
    ]


def test_the_public_names_are_those_the_architecture_doc_defines():
    """docs/architecture.md's "The public names" names the modules the check above takes as public, the one it
    excepts, and every name of `thunderfx_debug.__all__`."""
    import thunderfx_debug

    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    section = text.split("## The public names\n", 1)[1].split("\n## ", 1)[0]
    spans = set(re.findall(r"`([^`]+)`", section))
    assert {s for s in spans if s.startswith("thunderfx_debug.")} == {"thunderfx_debug.__all__", *PUBLIC_MODULES,
                                                                      *NOT_PUBLIC}
    assert set(thunderfx_debug.__all__) <= spans


def test_internals_says_why_for_each_name_it_hands_out_and_hands_out_nothing_public():
    internals = _load(INTERNALS)
    tree = ast.parse((BENCHMARKS / f"{INTERNALS}.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    explained = set(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`", internals.__doc__))
    assert [name for name in [*internals.HANDED_OUT, *functions] if name not in explained] == []
    for name, (module, attribute) in internals.HANDED_OUT.items():
        assert not _public(module if attribute is None else f"{module}.{attribute}"), f"{name} is public: import it"
        assert getattr(internals, name) is not None
