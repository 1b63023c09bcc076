"""Names of the files in a dump, in one place (they follow Thunder's report module, so a file name leads back to
the graph, split and region it came from):

    rank0/manifest.json  summary.txt  trace.json
    rank0/graph0/graph.json  graph0_repro_eager.py ...
    rank0/graph0/graph0_thunder_0/fwd_trace.py  bwd_trace.py  graph0_thunder_0_repro_thunder.py ...
    rank0/graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py
    rank0/graph0/inputs/graph0_inputs.pt  rank0/graph0/graph0_thunder_0/inputs/graph0_thunder_0_inputs.pt
    rank0/graph0/graph0_thunder_0/fusions/inputs/graph0_thunder_0_nvFusion0_forward_inputs.pt
    runs/<run id>/rank0/...   earlier runs into the same directory (the latest run is always at rank<R>/)
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

MANIFEST = "manifest.json"
SUMMARY = "summary.txt"
TRIAGE = "triage.md"  # the flush-time triage against inductor (THUNDERFX_DEBUG_TRIAGE)
BENCH = "bench.md"  # `thunderfx-debug bench`: the dumped scripts timed against each other
CHROME_TRACE = "trace.json"
GRAPH_JSON = "graph.json"
INPUTS_DIR = "inputs"
RUNS_DIR = "runs"

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def rank_dir_name(rank: int) -> str:
    return f"rank{rank}"


def earlier_run_dir(run_id: str) -> str:
    """Where an earlier run's rank directories go, relative to the dump directory."""
    return f"{RUNS_DIR}/{run_id}"


def graph_dir(graph: str) -> str:
    return graph


def split_prefix(graph: str, split: str) -> str:
    return f"{graph}_{split}"


def split_dir(graph: str, split: str) -> str:
    return f"{graph_dir(graph)}/{split_prefix(graph, split)}"


def fusion_prefix(graph: str, split: str, fusion: str, phase: str) -> str:
    return f"{split_prefix(graph, split)}_{fusion}_{phase}"


def fusions_dir(graph: str, split: str) -> str:
    return f"{split_dir(graph, split)}/fusions"


def graph_script(graph: str, kind: str) -> str:
    """kind: eager, thunder, torchcompile."""
    return f"{graph_dir(graph)}/{graph}_repro_{kind}.py"


def split_script(graph: str, split: str, kind: str) -> str:
    """kind: eager, thunder, inductor."""
    return f"{split_dir(graph, split)}/{split_prefix(graph, split)}_repro_{kind}.py"


def fusion_script(graph: str, split: str, fusion: str, phase: str, kind: str) -> str:
    """kind: nvfuser, inductor."""
    return f"{fusions_dir(graph, split)}/{fusion_prefix(graph, split, fusion, phase)}_repro_{kind}.py"


def trace_file(graph: str, split: str, phase: str) -> str:
    """phase: forward, backward."""
    return f"{split_dir(graph, split)}/{'fwd' if phase == 'forward' else 'bwd'}_trace.py"


def inputs_file(graph: str, split: str | None = None, region: str | None = None) -> str:
    """Where the saved real inputs of a graph (or of one of its splits, or of a fusion region of a split: `region`
    is its key, "nvFusion0_forward") go."""
    if split is None:
        return f"{graph_dir(graph)}/{INPUTS_DIR}/{graph}_inputs.pt"
    if region is not None:
        return f"{fusions_dir(graph, split)}/{INPUTS_DIR}/{split_prefix(graph, split)}_{region}_inputs.pt"
    return f"{split_dir(graph, split)}/{INPUTS_DIR}/{split_prefix(graph, split)}_inputs.pt"


def mismatch_script(graph: str, split: str, kind: str, region: str | None = None) -> str:
    """The script of a piece the correctness sentinel found mismatching: a split (kind: thunder) or a fusion region
    (`region` "nvFusion0_forward"; kind: nvfuser, inductor)."""
    if region is None:
        return f"{split_dir(graph, split)}/{split_prefix(graph, split)}_repro_mismatch_{kind}.py"
    return f"{fusions_dir(graph, split)}/{split_prefix(graph, split)}_{region}_repro_mismatch_{kind}.py"


def mismatch_inputs_file(graph: str, split: str, region: str | None = None) -> str:
    """The inputs (and outputs, or gradients) of a mismatching piece's first mismatching call."""
    if region is None:
        return f"{split_dir(graph, split)}/{INPUTS_DIR}/{split_prefix(graph, split)}_mismatch_inputs.pt"
    return f"{fusions_dir(graph, split)}/{INPUTS_DIR}/{split_prefix(graph, split)}_{region}_mismatch_inputs.pt"


def safe_relative(path: str) -> PurePosixPath:
    """Checks that a path read from a dump stays inside it: relative, no '..', plain names only.

    Raises ValueError otherwise; loading a dump must never read or write outside the dump directory.
    """
    candidate = PurePosixPath(path)
    if candidate.is_absolute() or not candidate.parts or "\\" in path:
        raise ValueError(f"{path!r} is not a relative path inside the dump")
    for part in candidate.parts:
        if part in ("..", ".") or not _SAFE_NAME.match(part):
            raise ValueError(f"{path!r} has a component {part!r} that is not allowed in a dump path")
    return candidate
