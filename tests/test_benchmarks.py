"""The benchmark scripts' own logic on CPU, with real Thunder runs: what they match, check and refuse. Their figures
come from the H200 (benchmarks/RESULTS.md); nothing here is timed."""

from __future__ import annotations

import importlib.util
import json
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


def test_sampled_step_parts_tells_sampled_steps_that_measure_memory_from_those_that_do_not(tmp_path):
    """benchmarks/sampled_step_parts.py on the tiny Llama: sampled calls 56 (the second: memory measured) and 106 (the
    third: timed only), each with its parts; the wrappers leave training as it was (a fresh process)."""
    out = tmp_path / "parts.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "sampled_step_parts.py"), "--steps", "100", "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())["results"]
    sampled = {s["call"]: s for s in results["sampled_steps"]}
    assert sorted(sampled) == [56, 106] and sampled[56]["memory"] and not sampled[106]["memory"]
    with_memory = results["parts_us_mean_sampled_with_memory"]
    assert {"saved-tensor hooks on", "autograd walk (memory)", "autograd walk (sampler)"} <= set(with_memory)
    assert "autograd walk (sampler)" in results["parts_us_mean_sampled_without_memory"]
    assert "saved-tensor hooks on" not in results["parts_us_mean_sampled_without_memory"]
