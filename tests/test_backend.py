"""What ReportingBackend records from a real (CPU) Thunder run, and the dump it writes of it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.settings.config import ConfigError
from thunderfx_debug.records import Phase, SplitKind

STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short training run of the tiny GPT (a graph break, torch.sinc sent to inductor), dumped once."""
    torch._dynamo.reset()
    dump_dir = tmp_path_factory.mktemp("dump")
    model, config = tiny_gpt()
    backend = ReportingBackend(dump_dir=dump_dir, timing="graph", timing_every=2, timing_warmup=1,
                               executors=cpu_executors(), strict=True)
    train(torch.compile(model, backend=backend), model, config, STEPS)
    rank_dir = backend.flush()
    yield backend, backend.report(), rank_dir
    torch._dynamo.reset()


def test_graphs_have_dynamo_facts(run):
    _, report, _ = run
    assert [g.name for g in report.graphs] == ["graph0", "graph1"]
    first, second = report.graphs
    assert first.compile_id.endswith("/0") and second.compile_id.endswith("/0")
    assert first.compile_id != second.compile_id
    assert "graph_break" in first.break_reason  # torch._dynamo.graph_break() in GPT.forward
    assert second.break_reason is None  # the frame's last graph ends with the return
    assert first.node_count > second.node_count > 0
    assert all(g.calls == STEPS for g in report.graphs)
    tokens = first.input_meta[0]
    assert tokens.kind == "tensor" and tokens.dtype == "torch.int64" and tokens.shape == (4, 16)
    assert 0 <= tokens.min_value <= tokens.max_value < 64


def test_splits_and_reasons(run):
    _, report, _ = run
    graph0 = report.graphs[0]
    kinds = [(s.name, s.kind) for s in graph0.splits]
    assert kinds == [("thunder_0", SplitKind.THUNDER), ("inductor_1", SplitKind.INDUCTOR), ("thunder_2", SplitKind.THUNDER)]
    inductor = graph0.split("inductor_1")
    assert inductor.ops == ("torch.sinc",)
    [reason] = inductor.reasons
    assert reason.type == "MISSING_OP_SUPPORT" and reason.op == "torch.sinc" and reason.node == "sinc"
    assert not graph0.unattributed_reasons
    assert "torch.nn.functional.scaled_dot_product_attention" in graph0.split("thunder_0").ops


def test_traces_and_fusions_read_from_the_run(run):
    _, report, _ = run
    for graph in report.graphs:
        for split in graph.splits:
            if split.kind is SplitKind.INDUCTOR:
                assert split.fwd_trace is None and not split.fusions
                continue
            assert "def computation" in split.fwd_trace and "def backward_fn" in split.bwd_trace
            forward, backward = split.fusions_in(Phase.FORWARD), split.fusions_in(Phase.BACKWARD)
            assert [f.name for f in forward] == ["TorchCompile0"]
            assert [f.name for f in backward] == ["TorchCompile1"]
            for fusion in forward + backward:
                assert fusion.executor == "torchcompile"
                assert fusion.ops and fusion.inputs and fusion.outputs
                assert f"{fusion.name}(" in (split.fwd_trace if fusion.phase is Phase.FORWARD else split.bwd_trace)


def test_graph_timing_samples_on_the_sampled_calls(run):
    _, report, _ = run
    for graph in report.graphs:
        assert graph.timing.calls == (2, 4) and graph.timing.clock == "host"
        assert graph.backward_timing.calls == (2, 4)
        assert all(s > 0 for s in graph.timing.samples_ms)
        assert all(s.timing is None for s in graph.splits)  # split timing is off at THUNDERFX_DEBUG_TIMING=graph


def test_the_backend_says_which_calls_it_sampled_as_its_runners_sampled_them(run):
    backend, report, _ = run
    for graph in report.graphs:
        assert graph.timing.calls == tuple(c for c in range(1, STEPS + 1) if backend.is_sampled(c))
    assert not any(backend.is_checked(c) for c in range(1, 50))  # the sentinel is off
    checking = ReportingBackend(check="fusion", check_every=5, timing_every=5, timing_warmup=0)
    assert [c for c in range(1, 12) if checking.is_checked(c)] == [1, 6, 11]
    assert [c for c in range(1, 12) if checking.is_sampled(c)] == [2, 7]  # a sample due on a checked call moves on


def test_summary_says_what_happened(run):
    _, report, _ = run
    text = str(report)
    for expected in ("graph0", "thunder_0", "inductor_1", "MISSING_OP_SUPPORT", "torch.sinc", "TorchCompile0"):
        assert expected in text


def test_dump_layout_and_round_trip(run):
    _, report, rank_dir = run
    assert rank_dir.name == "rank0"
    for name in ("manifest.json", "summary.txt", "trace.json", "graph0/graph.json",
                 "graph0/graph0_thunder_0/fwd_trace.py", "graph0/graph0_thunder_0/bwd_trace.py"):
        assert (rank_dir / name).is_file(), name
    manifest = json.loads((rank_dir / "manifest.json").read_text())
    assert manifest["versions"]["lightning-thunder"] == "0.2.6"
    assert manifest["config"]["timing"] == "graph"
    loaded = load_report(rank_dir.parent)
    assert _same_except_files(loaded, report)
    assert loaded.graphs[0].split("thunder_0").files["fwd_trace"] == "graph0/graph0_thunder_0/fwd_trace.py"


def _same_except_files(loaded, report):
    # report() is read after the flush and has no `files` (nothing written by it); compare the rest.
    import dataclasses

    def strip(graph):
        splits = tuple(dataclasses.replace(s, files={}) for s in graph.splits)
        return dataclasses.replace(graph, files={}, splits=splits)

    return [strip(g) for g in loaded.graphs] == [strip(g) for g in report.graphs]


def test_load_without_thunder(run, tmp_path):
    """load_report and the summary work in a process that never imports thunder."""
    _, _, rank_dir = run
    code = (
        "import sys, thunderfx_debug\n"
        f"r = thunderfx_debug.load_report({str(rank_dir)!r})\n"
        "assert r.graphs[0].split('inductor_1').reasons[0].op == 'torch.sinc'\n"
        "str(r)\n"
        "assert 'thunder' not in sys.modules, 'thunder was imported'\n"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_other_schema_version_is_refused(run, tmp_path):
    import shutil

    from thunderfx_debug import DumpError

    _, _, rank_dir = run
    copy = tmp_path / "rank0"
    shutil.copytree(rank_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["schema_version"] = 999
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DumpError, match="schema version 999"):
        load_report(copy)


def test_without_warmup_the_first_call_is_sampled_and_its_real_inputs_and_outputs_kept(tmp_path):
    """Warm-up 0 with real inputs: call 1 is both the capture of inputs and outputs and a timing sample, at graph and
    at split level; neither may win over the other."""
    torch._dynamo.reset()
    model, config = tiny_gpt()
    backend = ReportingBackend(dump_dir=tmp_path, timing="split", timing_every=2, timing_warmup=0, inputs="real",
                               executors=cpu_executors(), strict=True)
    train(torch.compile(model, backend=backend), model, config, steps=3)
    states = backend.recorder.graphs
    for state in states:
        assert state.captured.inputs is not None and state.captured.outputs is not None, state.name
        for split in state.splits:
            assert split.captured.inputs is not None and split.captured.outputs is not None, split.name
    report = backend.report()
    for graph in report.graphs:
        assert graph.timing.calls == (1, 3) and graph.backward_timing.calls == (1, 3), graph.name
        for split in graph.splits:
            assert split.timing.calls == (1, 3) and split.backward_timing.calls == (1, 3), (graph.name, split.name)


def test_a_near_miss_of_an_own_option_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"timing_evry=.*did you mean timing_every"):
        ReportingBackend(timing_evry=5)


def test_an_option_nothing_reads_is_named_after_the_first_compile_and_one_thunder_reads_is_not():
    def f(x):
        return torch.sin(x) * 2

    x = torch.randn(4, requires_grad=True)
    for options, named in (({"not_an_option": 3, "executorz": 1}, True), ({"nv_enable_linear": True}, False)):
        torch._dynamo.reset()
        backend = ReportingBackend(executors=cpu_executors(), strict=True, **options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.compile(f, backend=backend)(x).sum().backward()
        said = [str(w.message) for w in caught if "nothing read them" in str(w.message)]
        if named:
            assert len(said) == 1 and "'not_an_option'" in said[0] and "'executorz' (did you mean 'executors'?)" in said[0]
        else:
            assert not said
    torch._dynamo.reset()


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="transformer_engine is installed: Thunder does not warn")
def test_thunders_missing_transformer_engine_warning_is_left_out_of_this_packages_import_only():
    """Where the package imports Thunder (ReportingBackend), Thunder's warning that transformer_engine is not
    installed is not shown on every run; the user's own `import thunder` still shows it (Thunder is untouched)."""
    ours = "import thunderfx_debug; thunderfx_debug.ReportingBackend"
    theirs = "import thunderfx_debug, thunder"
    for code, warned in ((ours, False), (theirs, True)):
        done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("transformer_engine module not found" in done.stderr) == warned, (code, done.stderr[-2000:])
