"""Flush-time triage (THUNDERFX_DEBUG_TRIAGE) on real Thunder runs on CPU: a Thunder executor of our own that makes
one op slow is found as the deviating split, only its scripts are written (REPRO=none), and training is unchanged."""

from __future__ import annotations

import time

import pytest
import torch

import thunderfx_debug
from thunderfx_debug import load_report
from thunderfx_debug.children import standalone
from thunderfx_debug.settings.config import ConfigError, load_config
from thunderfx_debug.records import ClockKind
from thunderfx_debug.render.html import render_html

from conftest import cpu_executors

#: What the slow executor adds to each call of torch.cos: far more than the rest of its split costs on CPU.
SLOW_MS = 4.0


def _slow_executor():
    """A Thunder operator executor that runs torch.cos after sleeping SLOW_MS (claimed before any fusion executor)."""
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.extend import OperatorExecutor, get_executor, register_executor

    existing = get_executor("slow_cos")
    if existing is not None:
        return existing
    executor = OperatorExecutor("slow_cos", version="0.1")
    register_executor(executor)

    def slow_cos(a):
        time.sleep(SLOW_MS / 1e3)
        return torch.cos(a)

    # On the primitive: Thunder's autograd pass decomposes torch.cos into prims.cos before executors claim ops. A meta
    # of its own (not `like=`) leaves the symbol without subsymbols, which keeps Thunder's torch.compile executor from
    # fusing it into a region (it fuses a symbol whose subsymbols it can run).
    op = executor.register_operator("slow_cos", meta=lambda a: TensorProxy(like=a), fn=slow_cos)
    executor.register_implementation(prims.cos, op)
    return executor


class TwoGraphs(torch.nn.Module):
    """Two Dynamo graphs (a graph break between), one Thunder split each; only the second calls torch.cos."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(64, 64)
        self.second = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.first(x)) * 0.5
        torch._dynamo.graph_break()
        return torch.cos(self.second(y)).sum()


def _train(backend, steps: int, seed: int = 0):
    torch.manual_seed(seed)
    model = TwoGraphs()
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    losses = []
    for _ in range(steps):
        loss = compiled(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return model, compiled, x, torch.stack(losses)


def test_the_slow_split_deviates_gets_scripts_and_training_is_unchanged(tmp_path, monkeypatch, one_thread):
    executors = [_slow_executor(), *cpu_executors()]
    monkeypatch.setenv("THUNDERFX_DEBUG_TRIAGE", "fusion")
    monkeypatch.setenv("THUNDERFX_DEBUG_DEVIATION", "3")  # Thunder's per-call overhead on CPU stays below it
    monkeypatch.setenv("THUNDERFX_DEBUG_FLUSH_EVERY", "0")
    backend = thunderfx_debug.ReportingBackend(tmp_path, executors=executors, timing="split", strict=True)
    model, compiled, x, losses = _train(backend, steps=4)
    misses = [thunderfx_debug_cache_misses(s) for s in _thunder_splits(backend)]
    rank_dir = backend.flush()
    # Training goes on as if nothing happened: no new compile, no gradient left behind, the same losses.
    assert all(p.grad is None for p in model.parameters())
    assert [thunderfx_debug_cache_misses(s) for s in _thunder_splits(backend)] == misses
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = compiled(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses = torch.cat([losses, loss.detach()[None]])
    torch._dynamo.reset()
    monkeypatch.delenv("THUNDERFX_DEBUG_TRIAGE")
    plain = thunderfx_debug.ReportingBackend(executors=executors, timing="off")
    _, _, _, reference = _train(plain, steps=6)
    assert torch.equal(losses, reference)

    report = load_report(rank_dir)
    splits = {f"{g.name}/{s.name}": s for g in report.graphs for s in g.splits if s.kind.value == "thunder"}
    slow, other = splits["graph1/thunder_0"], splits["graph0/thunder_0"]
    assert slow.triage.error is None and other.triage.error is None
    assert slow.triage.deviates and slow.triage.ratio > 3 and slow.triage.clock is ClockKind.HOST
    assert slow.triage.thunder_ms > SLOW_MS > slow.triage.inductor_ms
    assert not other.triage.deviates
    assert slow.triage.inputs == "meta, the run's tensors for 2 of 3 inputs"  # its weights: the run's own, read only
    assert slow.triage.ms_per_step == pytest.approx(slow.triage.thunder_ms - slow.triage.inductor_ms)
    # The backend's own report carries what the flush timed, as the dump does.
    in_process = {f"{g.name}/{s.name}": s.triage for g in backend.report().graphs for s in g.splits}
    assert in_process["graph1/thunder_0"] == slow.triage and in_process["graph0/thunder_0"] == other.triage
    # Its regions are timed too, and none holds the slow op: the gap lies outside them.
    regions = [f for f in slow.fusions if f.triage is not None]
    assert regions and all(f.triage.error is None and not f.triage.deviates for f in regions)
    # Scripts only for the deviating split, named for why.
    scripts = sorted(p.name for p in rank_dir.rglob("*.py") if "_repro_" in p.name)
    assert scripts and all(name.startswith("graph1_thunder_0_slower_than_inductor_repro_") for name in scripts)
    assert set(slow.files) >= {"repro_thunder", "repro_inductor"} and not other.files.get("repro_thunder")
    triage_md = (rank_dir / "triage.md").read_text()
    assert triage_md.index("graph1/thunder_0") < triage_md.index("graph0/thunder_0")
    assert "graph1/thunder_0" in str(report)
    assert "Triage against inductor" in render_html({0: report})
    # Its Thunder script needs the custom executor, says which is missing and blames no backend (inductor's and
    # eager's run as any split's do).
    run = standalone.run_script(rank_dir / slow.files["repro_thunder"], timeout_s=300)
    assert run.outcome == "NOT_REBUILT" and "slow_cos" in run.stdout, run.stdout[-2000:]


def thunderfx_debug_cache_misses(compiled):
    import thunder

    return thunder.compile_stats(compiled).cache_misses


def _thunder_splits(backend):
    return [s.split.compiled for g in backend.recorder.graphs for s in g.splits if s.split.kind.value == "thunder"]


def test_bad_triage_settings_are_refused_before_training():
    with pytest.raises(ConfigError, match="THUNDERFX_DEBUG_DEVIATION='1'.*ratio > 1"):
        load_config(environ={"THUNDERFX_DEBUG_DEVIATION": "1"})
    with pytest.raises(ConfigError, match="THUNDERFX_DEBUG_TRIAGE='graph'.*allowed: off, split, fusion"):
        load_config(environ={"THUNDERFX_DEBUG_TRIAGE": "graph"})


def test_bench_runs_the_scripts_in_one_process_and_a_crashing_one_alone(tmp_path):
    from thunderfx_debug.commands import bench_worker

    rank_dir = tmp_path / "rank0"
    (rank_dir / "g").mkdir(parents=True)
    # Each script writes its pid: all but the crashing one share the worker's process.
    write = ("import json, os, sys\nassert sys.argv[1:3] == ['--benchmark', '--json']\n"
             "json.dump({'forward_ms': {ms}, 'backward_ms': None, 'pid': os.getpid()}, open(sys.argv[3], 'w'))\n")
    (rank_dir / "g" / "a_repro_thunder.py").write_text(write.replace("{ms}", "1.5"))
    (rank_dir / "g" / "b_repro_inductor.py").write_text("import sys\nsys.exit('inductor failed: out of memory')\n")
    (rank_dir / "g" / "c_repro_thunder.py").write_text("import os\nos.abort()\n")
    (rank_dir / "g" / "d_repro_inductor.py").write_text(write.replace("{ms}", "0.5") + "print('MISMATCH')\n"
                                                                                   "raise SystemExit(1)\n")
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    scripts = ["g/a_repro_thunder.py", "g/b_repro_inductor.py", "g/c_repro_thunder.py", "g/d_repro_inductor.py",
               "../escape.py"]
    results = bench_worker.run_in_one_process(rank_dir, scripts, results_dir, timeout_s=60)
    a, b, c, d, escape = (results[s] for s in scripts)
    assert (a.forward_ms, a.error) == (1.5, None)
    assert b.error and "out of memory" in b.error
    assert c.error and "killed by signal 6 (SIGABRT)" in c.error  # run alone after it took the worker down
    assert d.forward_ms == 0.5 and d.error is None and "exit status 1" in d.note
    assert escape.error
    import json

    pids = {json.loads((results_dir / name).read_text())["pid"] for name in ("a_repro_thunder.json",
                                                                            "d_repro_inductor.json")}
    assert len(pids) == 2  # a ran in the first worker; d in the one started after c crashed it


def test_regions_lowered_to_torch_calls_each_compile_as_themselves():
    """The inductor counterparts of a model's regions are exec'd functions compiled one by one: each must reach the
    compiler as itself. Without a source file for them, torch 2.11 (pytorch/pytorch#124269) runs them through one
    shared wrapper whose cache fills after 8, and the rest silently run eagerly: the triage then compares Thunder
    with eager and says "not judged"."""
    from thunderfx_debug.thunder.workarounds import exec_as_source_file

    compiled_graphs = []

    def counting_backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    regions = 12
    x = torch.randn(4)
    for i in range(regions):
        namespace = {"torch": torch}
        exec_as_source_file(f"def region_{i}(t):\n    return torch.sin(t) * {i + 1}\n", f"<region {i}>", namespace)
        out = torch.compile(namespace[f"region_{i}"], backend=counting_backend, fullgraph=True)(x)
        assert torch.equal(out, torch.sin(x) * (i + 1))
    assert len(compiled_graphs) == regions


def test_a_piece_whose_interval_reaches_past_the_threshold_is_undecided_not_within(tmp_path):
    """Three outcomes, from the interval alone: beyond the threshold (deviates), inside it (within), or reaching
    past it (undecided: more rounds would decide), counted apart on the page and in the summary."""
    import dataclasses

    from conftest import dump_fixtures
    from thunderfx_debug.records import Triage
    from thunderfx_debug.render import triage_findings

    report = load_report(dump_fixtures() / "normal" / "rank0")
    figures = {"straddles": (1.35, 0.94, 1.96), "inside": (1.02, 0.97, 1.08), "beyond": (1.6, 1.4, 1.8)}
    triages = iter(Triage(thunder_ms=ratio, inductor_ms=1.0, ratio=ratio, ratio_low=low, ratio_high=high,
                          deviates=low > 1.2, rounds=21) for ratio, low, high in figures.values())
    graphs = []
    for graph in report.graphs:
        splits = [dataclasses.replace(s, triage=next(triages, None)) if s.kind.value == "thunder" else s
                  for s in graph.splits]
        graphs.append(dataclasses.replace(graph, splits=tuple(splits)))
    report = dataclasses.replace(report, graphs=tuple(graphs))
    outcomes = [p.triage.outcome for p in triage_findings.triaged_pieces(report)]
    assert sorted(outcomes) == sorted(["undecided", "within", "deviates"][:len(outcomes)]) and len(outcomes) >= 2
    page = triage_findings.render_triage_md(report)
    assert "1 lie within it, 1 are undecided" in page
    assert "undecided: its interval reaches past 1.2x (more rounds would decide)" in page
    assert "undecided" in "\n".join(triage_findings.summary_lines(report))


def test_the_runs_own_time_of_a_piece_is_its_headline_and_a_thin_one_is_not_used():
    """The time a piece loses per step rests on the run's own samples of it, by the rule of every figure of the run:
    the first sampled call (cold caches, 10-30x the rest on CPU) and the calls the process compiled in left out, a
    split's forward and backward summed call by call. Fewer than MIN_SAMPLES such samples are not used: the time lost
    then comes from the triage's own times, and the run's is not set against them."""
    import dataclasses

    from conftest import dump_fixtures
    from thunderfx_debug.artifacts.report_builder import triage_beside_the_run
    from thunderfx_debug.records import MIN_SAMPLES, Timing, Triage
    from thunderfx_debug.render.headline import headline, left_out_calls

    report = load_report(dump_fixtures() / "normal" / "rank0")
    judged = Triage(clock=ClockKind.HOST, thunder_ms=2.0, inductor_ms=1.0, ratio=2.0, ratio_low=1.9, ratio_high=2.1,
                    deviates=True, rounds=21)
    graph = report.graphs[0]
    split = next(s for s in graph.splits if s.kind.value == "thunder")
    forward, backward = split.timing, split.backward_timing
    assert forward.clock is ClockKind.HOST
    sums = {c: forward.by_call[c] + backward.by_call[c] for c in forward.by_call if c in backward.by_call}
    expected = headline(Timing(tuple(sums[c] for c in sorted(sums)), tuple(sorted(sums)), forward.clock),
                        left_out_calls(graph))
    assert expected.count >= MIN_SAMPLES

    def triaged(timing=forward, backward_timing=backward, triage=judged):
        with_triage = dataclasses.replace(split, triage=triage, timing=timing, backward_timing=backward_timing)
        graphs = (dataclasses.replace(graph, splits=tuple(with_triage if s is split else s for s in graph.splits)),
                  *report.graphs[1:])
        return triage_beside_the_run(dataclasses.replace(report, graphs=graphs)).graphs[0].split(split.name).triage

    beside = triaged()
    assert (beside.run_ms, beside.run_samples) == (pytest.approx(expected.median_ms), expected.count)
    assert beside.lost_from_the_run and beside.ms_per_step == pytest.approx(
        expected.median_ms * (1 - 1 / 2.0) * beside.calls_per_step)
    # A cold first call 100x the rest, alone with two warm ones: too thin to be used.
    cold = Timing((100.0, 1.0, 1.2), (2, 3, 4), ClockKind.HOST)
    thin = triaged(cold, None)
    assert thin.run_samples == 2 and thin.run_too_thin and not thin.lost_from_the_run
    assert thin.ms_per_step == pytest.approx((2.0 - 1.0) * thin.calls_per_step)
    assert triaged(triage=dataclasses.replace(judged, clock=ClockKind.CUDA)).run_ms is None  # another clock


class AddsIntoItsIndices(torch.nn.Module):
    """T5's relative-position bias in miniature: buckets added into in place (`relative_buckets += ...`), then
    looked up in a table of 8 rows. Called twice on the same tensor, the second call adds again and indexes past
    the table."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(8, 4)

    def forward(self, buckets, shift):
        buckets += shift
        return self.table(buckets).sum()


def test_a_split_that_writes_into_its_index_inputs_is_judged_from_the_values_the_run_passed_each_call(tmp_path,
                                                                                                       one_thread):
    torch.manual_seed(0)
    backend = thunderfx_debug.ReportingBackend(dump_dir=tmp_path, triage="split", strict=True, executors=cpu_executors())
    model = AddsIntoItsIndices()
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        compiled(torch.randint(0, 4, (16, 16)), torch.full((16, 16), 4)).backward()
    backend.flush()
    splits = [s for g in backend.report().graphs for s in g.splits if s.kind.value == "thunder"]
    assert splits and all(s.triage is not None for s in splits)
    assert all(s.triage.error is None for s in splits), [s.triage.error for s in splits]
