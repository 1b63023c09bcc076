"""Hugging Face models from `benchmarks/harness.py` (tiny configs, no weights) trained on CPU under ReportingBackend
with every repro script dumped (`benchmarks/zoo.py`), and every one of their scripts verified as
`thunderfx-debug verify` runs them (long-lived workers, each script as `__main__` where thunderfx_debug cannot be
imported): Llama, GPT-2 (a split at every Conv1D) and BERT trained with dropout. Deterministic pieces must be OK;
random ones must either match eager after reseeding or say NOT COMPARABLE, never pass vacuously.

The H200 verifies the zoo with nvFuser: `benchmarks/zoo.py --device cuda` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
MODELS = ("llama", "gpt2", "bert-dropout")


def _zoo():
    spec = importlib.util.spec_from_file_location("benchmark_zoo", BENCHMARKS / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_script_of_the_zoo_verifies(tmp_path):
    from thunderfx_debug import load_report
    from thunderfx_debug.commands import verify

    zoo = _zoo()
    out = tmp_path / "zoo.json"
    status = zoo.main(["--device", "cpu", "--models", ",".join(MODELS), "--train-jobs", "2", "--jobs", "2",
                       "--dump", str(tmp_path / "zoo"), "--json", str(out)])
    data = json.loads(out.read_text())["results"]
    assert all("error" not in facts for facts in data["models"].values()), data["models"]
    assert all(not facts["reporting_failures"] for facts in data["models"].values()), data["models"]
    rows = data["scripts"]
    for model in MODELS:  # every script the records list, not a sample
        rank_dir = tmp_path / "zoo" / model / "rank0"
        listed = verify.scripts_of({rank_dir: load_report(rank_dir)}, tmp_path / "zoo")
        assert sorted(r["path"] for r in rows if r["model"] == model) == [s.path for s in listed]
    assert {r["kind"] for r in rows} >= {"graph_eager", "graph_thunder", "graph_torchcompile", "split_eager",
                                         "split_thunder", "split_inductor", "fusion_inductor"}
    assert len([r for r in rows if r["model"] == "gpt2"]) >= 40  # ThunderFX splits GPT-2 at every Conv1D
    deterministic = [r for r in rows if r["model"] != "bert-dropout"]
    failed = {r["path"]: r["line"] or r["note"] or r["log"] for r in deterministic if r["verdict"] != "OK"}
    assert not failed, failed
    random = [r for r in rows if r["model"] == "bert-dropout"]
    assert all(r["verdict"] in ("OK", "NOT_COMPARABLE") for r in random), [(r["path"], r["line"]) for r in random]
    # Thunder draws dropout as uniform < p, eager as bernoulli: the same seed gives other masks, and the script says
    # so rather than passing on a tolerance that the random numbers blew up.
    thunder = [r for r in random if r["kind"] == "split_thunder"]
    assert thunder and all(r["verdict"] == "NOT_COMPARABLE" and "random numbers" in r["line"] for r in thunder)
    assert status == 0
    assert json.loads((tmp_path / "zoo" / "verify.json").read_text())["clean"]
