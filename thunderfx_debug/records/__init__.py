"""The report's records and their JSON form (the dump schema).

Plain frozen dataclasses: no torch or thunder import, so a dump can be read and rendered on a laptop. Every record
has `to_json()` and a `from_json(data, where)` that validates what it reads and raises `DumpError` with the field
that was wrong; both come from one codec driven by the records' fields and type hints (`records.codec`).

- `records.pieces`: graphs, their splits and fusion regions, inputs, split reasons, the rank's collectives;
- `records.timing`: timing samples, disturbed calls, compile costs, the run's training steps, what a flush took;
- `records.memory`: what a piece held in memory (saved for its backward, peaks);
- `records.failures`: the exception the run itself raised in a graph (Thunder, nvFuser, a user's executor);
- `records.verdicts`: the correctness sentinel's checks, triage against inductor, minimized scripts;
- `records.sources`: the lines of the model's code a piece's ops came from (and, for a backward piece, those that
  made the saved values it reads), and the code around them;
- `records.layout`: the names of a dump's files (following Thunder's report module);
- `records.keys`: the key of a piece ("graph0/thunder_0/nvFusion0_forward"), written and read in one place;
- `records.stats`: the statistics of timings the diff's noise model and the flush-time triage share (Student's t,
  Yuen's test), pure Python.
"""

from thunderfx_debug.records.codec import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, DumpError
from thunderfx_debug.records.failures import FailedIn, RunFailure
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.records.memory import Memory
from thunderfx_debug.records.pieces import (
    BETWEEN_OPS, CollectiveCall, CollectiveLog, FusionRecord, GraphRecord, InputKind, InputMeta, OpGroup, Phase,
    RankRecord, SplitKind, SplitReason, SplitRecord, storage_span,
)
from thunderfx_debug.records.sources import (
    READS_SAVED, SourceExcerpt, SourceLine, origin_lines, short_path, short_sources,
)
from thunderfx_debug.records.timing import (
    MIN_SAMPLES, ClockKind, CompileCost, CostPart, CostStage, CostWhen, DisturbedCall, Disturbance, FlushCost,
    FlushPart, FlushStage, SampleTotals, Steps, Timing, TimingWindow, percentile,
)
from thunderfx_debug.records.verdicts import (
    DEVIATION, MAX_CHECK_REASONS, Check, Minimized, Triage, deviation_outcome,
)

__all__ = [
    "BETWEEN_OPS", "DEVIATION", "MAX_CHECK_REASONS", "MIN_SAMPLES", "READABLE_SCHEMA_VERSIONS", "READS_SAVED",
    "SCHEMA_VERSION", "Check", "ClockKind", "CollectiveCall", "CollectiveLog", "CompileCost", "CostPart",
    "CostStage", "CostWhen", "Disturbance", "DisturbedCall", "DumpError", "FailedIn", "FlushCost", "FlushPart",
    "FlushStage", "FusionRecord", "GraphRecord", "InputKind", "InputMeta", "Memory", "Minimized", "OpGroup",
    "Phase", "PieceKey", "RankRecord", "RunFailure", "SampleTotals", "SourceExcerpt", "SourceLine", "SplitKind",
    "SplitReason", "SplitRecord", "Steps", "Timing", "TimingWindow", "Triage", "deviation_outcome", "origin_lines",
    "percentile", "short_path", "short_sources", "storage_span",
]
