"""The zoo beyond dense decoders (benchmarks/zoo.py, tiny, CPU), one model a test file (`test_zoo_moe.py`,
`test_zoo_t5.py`, which two test processes run side by side): the model trained under ReportingBackend with every
repro script dumped, and every script verified as `thunderfx-debug verify` runs them (workers where
thunderfx_debug cannot be imported)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def zoo_module():
    """benchmarks/zoo.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("benchmark_zoo", BENCHMARKS / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def verified(tmp_path: Path, model: str) -> list[dict]:
    """Trains `model` for one step, verifies every script of its dump, and returns the scripts' rows (each listed
    script verified, the training without a failure of its own or of the reporting)."""
    from thunderfx_debug import load_report
    from thunderfx_debug.commands import verify

    out = tmp_path / "zoo.json"
    zoo_module().main(["--device", "cpu", "--models", model, "--steps", "1", "--jobs", "2", "--dump", str(tmp_path / "zoo"),
                 "--json", str(out)])
    data = json.loads(out.read_text())["results"]
    assert all("error" not in facts for facts in data["models"].values()), data["models"]
    assert all(not facts["reporting_failures"] for facts in data["models"].values()), data["models"]
    rows = data["scripts"]
    rank_dir = tmp_path / "zoo" / model / "rank0"
    listed = verify.scripts_of({rank_dir: load_report(rank_dir)}, tmp_path / "zoo")
    assert sorted(r["path"] for r in rows) == [s.path for s in listed]
    return rows
