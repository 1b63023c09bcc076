"""The zoo beyond dense decoders (benchmarks/zoo.py, tiny, CPU), one model a test file (`test_zoo_moe.py`,
`test_zoo_t5.py`, which two test processes run side by side): the model trained under ReportingBackend with every
repro script dumped, and its scripts verified as `thunderfx-debug verify` runs them (workers where thunderfx_debug
cannot be imported): every split's and fusion region's, and the whole graph's eager one. The whole graph's Thunder
and torch.compile scripts (about 30 s each on CPU, half of the verifying) run the templates `test_zoo.py` verifies on
a Llama, on a graph whose every piece is verified here; `python benchmarks/zoo.py --device cpu --models mixtral,t5-dropout`
verifies them too."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
#: verify's --only: each split's and fusion region's scripts (under graph<N>_<kind>_<M>/), the whole graph's eager one.
PIECES = ("*/graph[0-9]*_*_[0-9]*/*", "*/graph[0-9]*_repro_eager.py")


def zoo_module():
    """benchmarks/zoo.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("benchmark_zoo", BENCHMARKS / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def verified(tmp_path: Path, model: str) -> list[dict]:
    """Trains `model` for one step, verifies the scripts of its dump `PIECES` selects, and returns their rows (every
    listed script on disk, each selected one verified, the training without a failure of its own or of the
    reporting)."""
    from thunderfx_debug import load_report
    from thunderfx_debug.commands import verify

    out = tmp_path / "zoo.json"
    only = [argument for pattern in PIECES for argument in ("--only", pattern)]
    zoo_module().main(["--device", "cpu", "--models", model, "--steps", "1", "--jobs", "2", "--dump", str(tmp_path / "zoo"),
                       "--json", str(out), *only])
    data = json.loads(out.read_text())["results"]
    assert all("error" not in facts for facts in data["models"].values()), data["models"]
    assert all(not facts["reporting_failures"] for facts in data["models"].values()), data["models"]
    rows = data["scripts"]
    rank_dir = tmp_path / "zoo" / model / "rank0"
    listed = verify.scripts_of({rank_dir: load_report(rank_dir)}, tmp_path / "zoo")
    assert listed and not [s.problem for s in listed if s.problem]
    selected = verify.select(listed, PIECES)
    assert {s.kind for s in listed} - {s.kind for s in selected} <= {"graph_thunder", "graph_torchcompile"}
    assert sorted(r["path"] for r in rows) == [s.path for s in selected]
    return rows
