"""Multi-process runs: 2-process DDP and FSDP2 jobs under ReportingBackend, started by torchrun through
benchmarks/distributed.py (gloo on CPU, NCCL on 2 GPUs), each rank writing its own dump, then read back side by side.

Each rank learns its rank from torch.distributed, writes its own `rank<R>/` and nothing else; every run is compared
with the same training under plain ThunderCompiler; torch's flight recorder is on, so each dump holds the
collectives its rank enqueued. THUNDERFX_DEBUG_RANKS=1 makes rank 0 compile without recording and write nothing,
while DDP keeps training both ranks in step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from thunderfx_debug import load_report, load_reports
from thunderfx_debug.render import digest, ranks
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_ranks

BENCHMARK = Path(__file__).parents[1] / "benchmarks" / "distributed.py"
STEPS = 3


def _torchrun(out: Path, *arguments: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THUNDERFX_DEBUG_", "TORCH_FR_", "TORCH_NCCL_"))}
    env.update(OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE=str(out / "error.json"))
    command = [sys.executable, str(BENCHMARK), "--nproc", "2", "--size", "tiny", "--model", "gpt", "--layers", "1",
               "--steps", str(STEPS), "--executors", "default", "--out", str(out), "--json", str(out / "figures.json"),
               *arguments]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((out / "figures.json").read_text())["results"]


def _check_case(figures: dict, case: str) -> dict:
    """What every case must hold: one dump per rank, alike and apart, losses equal to plain ThunderCompiler's."""
    per_rank = {int(r): v for r, v in figures["cases"][case]["per_rank"].items()}
    for rank, result in per_rank.items():
        assert result["losses"]["equal"], (rank, result["reporting"]["losses"], result["plain"]["losses"])
    assert per_rank[0]["reporting"]["losses"] != per_rank[1]["reporting"]["losses"]  # each rank saw its own data

    case_dir = Path(figures["cases"][case]["dumps"])
    assert sorted(p.name for p in case_dir.iterdir()) == ["rank0", "rank1", "report.html", "side_by_side.txt"]
    reports = load_reports(case_dir)
    assert sorted(reports) == [0, 1]
    # One run: the ranks derived the same run id (torchrun's rendezvous id) without communicating.
    assert reports[0].meta["run_id"] == reports[1].meta["run_id"] and reports[0].meta["run_id"].endswith("-restart0")
    for rank, report in reports.items():
        assert report.meta["rank"] == rank and report.meta["world_size"] == 2
        assert report.meta["reporting_failures"] == []
    assert digest.structure(reports[0]) == digest.structure(reports[1])
    # Nothing shared: a file of one rank's dump is not the other's (no links, no common inodes).
    inodes = [{(p.stat().st_dev, p.stat().st_ino) for p in (case_dir / f"rank{r}").rglob("*")} for r in (0, 1)]
    assert not inodes[0] & inodes[1]

    # The side-by-side view the benchmark wrote is the renderer's, and its figures are the digest's.
    assert (case_dir / "side_by_side.txt").read_text() == render_ranks(reports)
    assert (case_dir / "report.html").read_text() == render_html(reports, {0: "rank0/", 1: "rank1/"},
                                                                 title=f"ThunderFX report: {case}")
    view = figures["cases"][case]["side_by_side"]
    steps = ranks.rank_steps(reports)
    spread = ranks.spread(steps)
    assert all(s.compiled_ms and s.compiled_ms > 0 and s.clock.value == "host" for s in steps)
    assert view["spread"]["slowest"] == spread.slowest and view["spread"]["excess_ms"] == pytest.approx(spread.excess_ms)
    pieces = ranks.slowest_pieces(reports, spread.slowest)
    assert [p["label"] for p in view["slowest_pieces"]] == [p.label for p in pieces] and pieces
    for piece in pieces:  # the same pieces exist on both ranks (they split alike)
        assert all(piece.ms_per_step[r] is not None for r in (0, 1))

    # The collectives of DDP and FSDP2 run outside the graphs: none in any split, all in the flight recorder.
    assert all(ranks.collective_places(r) == [] for r in reports.values())
    assert all(s.collective_ms is None for s in steps)
    lags = ranks.arrival_lags(reports)
    assert lags is not None and lags.matched > 0 and sum(lags.last.values()) == lags.matched and lags.same_host
    return reports


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("distributed")
    return _torchrun(out, "--parallel", "ddp,fsdp2")


def test_ddp_on_two_cpu_processes_with_gloo(two_rank_run):
    reports = _check_case(two_rank_run, "gpt_ddp")
    per_rank = two_rank_run["cases"]["gpt_ddp"]["per_rank"]
    assert per_rank["0"]["reporting"]["parameter_checksum"] == pytest.approx(
        per_rank["1"]["reporting"]["parameter_checksum"], rel=1e-6)  # DDP kept the replicas in step
    for report in reports.values():
        # DDP's optimizer handed the backend one graph per gradient bucket, all of one compile: no recompile.
        (compile_id, graphs), = ranks.ddp_buckets(report).items()
        assert graphs == [g.name for g in report.graphs] and len(graphs) == 2
        assert all(g.compile_id == compile_id and g.calls == STEPS for g in report.graphs)
        assert digest.counts(report)["recompiles"] == 0
        names = {call.name for call in report.collectives.calls}
        assert "gloo:all_reduce" in names
        # Every step all-reduces its gradients (bucket by bucket; DDP rebuilds its buckets after the first step).
        assert sum(call.name == "gloo:all_reduce" for call in report.collectives.calls) >= STEPS


def test_fsdp2_on_two_cpu_processes_with_gloo(two_rank_run):
    """torch 2.13 shards on CPU with gloo (`fully_shard` over a CPU device mesh): each block's forward is compiled,
    FSDP2's hooks all-gather and reduce-scatter around it."""
    reports = _check_case(two_rank_run, "gpt_fsdp2")
    blocks = two_rank_run["cases"]["gpt_fsdp2"]["per_rank"]["0"]["reporting"]["blocks"]
    for report in reports.values():
        (graph,) = report.graphs  # one compile serves every block
        assert graph.calls == STEPS * blocks and not ranks.ddp_buckets(report)
        # All-gathers of the blocks' parameters; the gradients are reduced by all-reduce, as FSDP2 does on gloo
        # (which has no reduce-scatter of tensors); NCCL reduce-scatters them.
        assert {call.name for call in report.collectives.calls} >= {"gloo:all_gather", "gloo:all_reduce"}


def test_only_the_ranks_named_record(tmp_path):
    """THUNDERFX_DEBUG_RANKS=1: only rank 1 recorded and wrote; rank 0 trained all the same, in step with it."""
    figures = _torchrun(tmp_path, "--parallel", "ddp", "--ranks", "1", "--no-plain")
    per_rank = figures["cases"]["gpt_ddp"]["per_rank"]
    assert [per_rank[r]["reporting"]["recorded"] for r in ("0", "1")] == [False, True]
    assert per_rank["0"]["reporting"]["parameter_checksum"] == pytest.approx(
        per_rank["1"]["reporting"]["parameter_checksum"], rel=1e-6)
    only = tmp_path / "gpt_ddp"
    assert sorted(p.name for p in only.iterdir()) == ["rank1", "report.html", "side_by_side.txt"]
    report = load_report(only)
    assert report.meta["rank"] == 1 and report.meta["config"]["ranks"] == [1]


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_and_fsdp2_on_two_gpus_with_nccl(tmp_path):
    # Thunder's torch.compile executor fuses: the H200's nvFuser miscompiles the GPT (benchmarks/RESULTS.md).
    figures = _torchrun(tmp_path, "--parallel", "ddp,fsdp2", "--device", "cuda", "--executors", "torch_compile")
    for case in ("gpt_ddp", "gpt_fsdp2"):
        for result in figures["cases"][case]["per_rank"].values():
            assert result["losses"]["first_step_equal"]
        reports = load_reports(figures["cases"][case]["dumps"])
        assert sorted(reports) == [0, 1] and all(s.clock.value == "cuda" for s in ranks.rank_steps(reports))
        assert any(call.duration_ms is not None for r in reports.values() for call in r.collectives.calls)


def test_a_closed_backend_writes_no_more(tmp_path):
    """A process that trains several models one after another (as benchmarks/distributed.py does) closes each
    backend: its dump stays as it was when its training ended, whatever flushes come later (at exit, periodic)."""
    from conftest import tiny_gpt, train
    from thunderfx_debug import ReportingBackend

    model, config = tiny_gpt(graph_break=False, sinc_gate=False)
    backend = ReportingBackend(dump_dir=tmp_path)  # Thunder's default executors: no fusion to compile, quick
    train(torch.compile(model, backend=backend), model, config, steps=2)
    rank_dir = backend.close()
    manifest = (rank_dir / "manifest.json").read_bytes()
    assert load_report(tmp_path).graphs[0].calls == 2
    assert not backend.recording and backend.flush() is None
    assert (rank_dir / "manifest.json").read_bytes() == manifest
