"""Multi-process runs: a 2-process DDP job under ReportingBackend (torchrun; gloo on CPU, NCCL on 2 GPUs).

Each rank learns its rank from torch.distributed (the script removes RANK and LOCAL_RANK after init), writes its
own `rank<R>/` and nothing else; THUNDERFX_DEBUG_RANKS=1 makes rank 0 compile without recording and write nothing,
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

SCRIPT = Path(__file__).with_name("ddp_train.py")


def _torchrun(out: Path, device: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THUNDERFX_DEBUG_")}
    env.update(OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE=str(out / "error.json"))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(SCRIPT), str(out), device]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _check(out: Path) -> None:
    results = {r["rank"]: r for r in (json.loads((out / f"result{i}.json").read_text()) for i in (0, 1))}
    for run in ("all", "rank1_only"):
        (losses0, checksum0), (losses1, checksum1) = results[0][run], results[1][run]
        assert losses0 != losses1  # each rank saw its own data...
        assert checksum0 == pytest.approx(checksum1, rel=1e-6)  # ... and DDP kept the parameters in step

    # Every rank recording: one directory per rank, each knowing its rank, nothing else at the top.
    everyone = out / "all"
    assert sorted(p.name for p in everyone.iterdir()) == ["rank0", "rank1"]
    reports = load_reports(everyone)
    assert sorted(reports) == [0, 1]
    # One run: the ranks derived the same run id (torchrun's rendezvous id) without communicating.
    assert reports[0].meta["run_id"] == reports[1].meta["run_id"] and reports[0].meta["run_id"].endswith("-restart0")
    for rank, report in reports.items():
        assert report.meta["rank"] == rank and report.meta["world_size"] == 2
        assert report.meta["reporting_failures"] == []
        assert report.graphs and all(g.calls == 3 for g in report.graphs)
        assert sum(g.timing.count for g in report.graphs) >= 3
    # Nothing shared: a file of one rank's dump is not the other's (no links, no common inodes).
    inodes = [{(p.stat().st_dev, p.stat().st_ino) for p in (everyone / f"rank{r}").rglob("*")} for r in (0, 1)]
    assert not inodes[0] & inodes[1]

    # THUNDERFX_DEBUG_RANKS=1: only rank 1 recorded and wrote; rank 0 trained all the same.
    only = out / "rank1_only"
    assert sorted(p.name for p in only.iterdir()) == ["rank1"]
    assert load_report(only).meta["rank"] == 1 and load_report(only).meta["config"]["ranks"] == [1]


def test_two_process_ddp_on_cpu_with_gloo(tmp_path):
    _torchrun(tmp_path, "cpu")
    _check(tmp_path)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_process_ddp_on_two_gpus_with_nccl(tmp_path):
    _torchrun(tmp_path, "cuda")
    _check(tmp_path)
