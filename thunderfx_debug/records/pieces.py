"""The records of what ThunderFX made of a run: graphs, their splits and fusion regions, their inputs, split reasons,
and the rank's log of collectives. Their JSON form (the dump schema) is `records.codec`'s, from their fields."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from thunderfx_debug.records.codec import SCHEMA_VERSION, JsonRecord, json_field
from thunderfx_debug.records.failures import RunFailure
from thunderfx_debug.records.memory import Memory
from thunderfx_debug.records.sources import SourceExcerpt
from thunderfx_debug.records.timing import CompileCost, DisturbedCall, FlushCost, Steps, Timing
from thunderfx_debug.records.verdicts import Check, Minimized, Triage

class SplitKind(str, enum.Enum):
    THUNDER = "thunder"
    INDUCTOR = "inductor"


class Phase(str, enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"


class InputKind(str, enum.Enum):
    """What an input of a graph, split or fusion region was."""

    TENSOR = "tensor"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    SYMINT = "symint"  # a symbolic size; `value` is its hint
    COMPLEX = "complex"  # `value` is [real, imaginary]
    NONE = "none"
    DTYPE = "dtype"  # `value` is its name ("torch.float32")
    DEVICE = "device"  # `value` is its name ("cuda:0")
    SIZE = "size"  # a torch.Size (a split may hand one to the next); `value` is its sizes
    TUPLE = "tuple"  # a tuple of numbers; `value` is the numbers
    OTHER = "other"  # `value` is its repr


#: The op group of a split's time outside its fusion regions that no op opened: the start of a trace (unpacking its
#: inputs) and what follows a fusion region before the next op (Thunder's dels, views, bookkeeping).
BETWEEN_OPS = "between ops"


@dataclasses.dataclass(frozen=True)
class OpGroup(JsonRecord):
    """The non-fusion work of a thunder split's trace of one phase, grouped by symbol and executor ("linear" run by
    "torch", "sdpa" by "cudnn"): `count` bound symbols of the trace, and the summed time of all of them on each
    sampled call (`timing`). An op's time runs from its mark to the next mark, so the views, dels and unpacks that
    follow an op (they launch no kernel) count with it. `symbol` BETWEEN_OPS (executor "thunder") is the rest of the
    time outside the regions; the groups of a phase and its regions add up to the trace's time. `sources`: the lines
    of the model's code its ops came from ("file:line function", most ops first; see `records.sources`).
    `reads_saved_from` (backward groups): the lines of the forward ops that produced the values saved for the
    backward that its ops read, most reads first; where its ops were made, not where they came from."""

    symbol: str
    executor: str = json_field(missing="")  # older dumps may lack it
    phase: Phase
    count: int = 0
    timing: Timing | None = None
    sources: tuple[str, ...] = json_field((), omit_default=True)
    reads_saved_from: tuple[str, ...] = json_field((), omit_default=True)

    def __post_init__(self):
        object.__setattr__(self, "phase", Phase(self.phase))

    @property
    def label(self) -> str:
        """"linear [torch]": the group's name in reports."""
        return f"{self.symbol} [{self.executor}]"


def storage_span(shape: tuple[int, ...] | list[int], stride: tuple[int, ...] | list[int]) -> int:
    """Elements of storage that a strided tensor reaches from its storage offset (0 for an empty one).

    Example (a [4, 3] view of rows 3 apart, and a row expanded 5 times):
        >>> storage_span((4, 3), (3, 1)), storage_span((5, 3), (0, 1))
        (12, 3)
    """
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))


@dataclasses.dataclass(frozen=True)
class InputMeta(JsonRecord):
    """One input of a graph, split or fusion region as the run saw it: a tensor's metadata, or a Python value.

    For tensors: the layout (`stride` 0 in a dimension the run's tensor was expanded along; `storage_size` the
    elements of its storage, None where unknown), and what the values were, where read (None otherwise): the range
    `min_value`/`max_value`; for integers the smallest value >= 0 (`nonnegative_min`) and the one negative value they
    held, if only one (`sentinel`, such as the ignore_index -100 of labels), with the fraction of elements holding
    it; for bools and 0/1 integer masks the fraction that is True (`true_fraction`); for a scalar tensor its `value`.
    `index_bound` is the size of the dimension an integer input indexes, from the op that consumes it.
    `alias_of` is the index of the first input of the same call whose storage the tensor shares (a view of it, or of
    the same tensor), None where it shares none.
    For other inputs, `value` is the value (a number; a dtype or device by name; the repr of anything else).
    """

    kind: InputKind
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    storage_offset: int = 0
    dtype: str = ""
    device: str = ""
    requires_grad: bool = False
    min_value: float | int | bool | None = None
    max_value: float | int | bool | None = None
    value: Any = None
    storage_size: int | None = None
    nonnegative_min: int | None = None
    sentinel: int | None = None
    sentinel_fraction: float | None = None
    true_fraction: float | None = None
    index_bound: int | None = None
    # Written only where set (older readers never saw them): an nn.Parameter in the run (compiled code may guard on
    # the type); the first input of the same call whose storage this tensor shares in the run.
    parameter: bool = json_field(False, omit_default=True)
    alias_of: int | None = json_field(None, omit_default=True)

    def __post_init__(self):
        object.__setattr__(self, "kind", InputKind(self.kind))  # "tensor" given as text is the same kind

    def describe(self) -> str:
        if self.kind is InputKind.TENSOR:
            return f"{self.dtype.replace('torch.', '')}{list(self.shape)}@{self.device}"
        return f"{self.kind.value}={self.value!r}"

    @property
    def expanded_dims(self) -> tuple[int, ...]:
        """The dimensions of size > 1 with stride 0 (the run's tensor was a broadcast view along them)."""
        return tuple(i for i, (n, s) in enumerate(zip(self.shape, self.stride)) if s == 0 and n > 1)


@dataclasses.dataclass(frozen=True)
class SplitReason(JsonRecord):
    """Why ThunderFX sent an op to inductor. `type` is thunder's SplitReasonType name (e.g. "MISSING_OP_SUPPORT").

    `op` is the FX node that caused it (None where thunder's message names none); `exception` is the text of the
    exception that thunder caught while checking the op, which thunder's own string form of the reasons drops.
    """

    type: str
    info: str = json_field(missing="")
    exception: str | None = None
    node: str | None = None
    op: str | None = None


@dataclasses.dataclass(frozen=True)
class FusionRecord(JsonRecord):
    """A fusion region of a Thunder trace: `nvFusionN` (nvFuser) or `TorchCompileN` (Thunder's torch.compile executor).

    `ops` are the symbols fused into the region in trace order; `inputs`/`outputs` are the trace names of its
    arguments and results, `input_meta` their metadata where known. `sources`: the lines of the model's code its ops
    came from ("file:line function", most ops first; see `records.sources`). `reads_saved_from` (backward regions):
    the lines of the forward ops that produced the values saved for the backward that it reads, most reads first:
    where the forward values it uses were made, not lines of its own ops (Thunder 0.2.6 gives its grad rules none).
    """

    name: str
    executor: str = json_field(missing="")  # older dumps may lack it
    phase: Phase
    ops: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    input_meta: tuple[InputMeta, ...] = ()
    timing: Timing | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Check | None = None
    triage: Triage | None = json_field(None, omit_default=True)
    minimized: Minimized | None = json_field(None, omit_default=True)
    sources: tuple[str, ...] = json_field((), omit_default=True)
    reads_saved_from: tuple[str, ...] = json_field((), omit_default=True)

    @property
    def qualified_name(self) -> str:
        return f"{self.name}_{self.phase.value}"


@dataclasses.dataclass(frozen=True)
class SplitRecord(JsonRecord):
    """A submodule ThunderFX split a Dynamo graph into: `thunder_N` (run by Thunder) or `inductor_N` (torch.compile).

    `timing` is the forward device time of the submodule's calls and `backward_timing` that of its backward.
    `fwd_trace`/`bwd_trace` are the final Thunder traces (Python source), None for inductor splits or when the
    split never ran. `error` is the text of a failure while compiling or running it, if any.

    `host_timing`/`host_backward_timing` are the host wall time (perf_counter) of the same sampled calls, recorded
    where `timing` is device time (CUDA); on CPU runs `timing` is host time already and they are None.
    `thunder_overhead_timing` is, per sampled call, the host time Thunder spent in the split's forward call outside
    its computation (cache check, prologue, autograd connection, epilogue; from Thunder's compile stats).
    `op_groups` is the split's time outside its fusion regions by op (fusion-level timing, see `OpGroup`).
    `compile_cost` is what its first call cost (see `CompileCost`).
    `sources` are the lines of the model's code its ops came from ("file:line function", most ops first).
    `memory` is what it held in memory on its sampled calls (see `Memory`), None where nothing was sampled.
    """

    name: str
    kind: SplitKind
    ops: tuple[str, ...] = ()
    reasons: tuple[SplitReason, ...] = ()
    fusions: tuple[FusionRecord, ...] = ()
    fwd_trace: str | None = json_field(None, written=False)  # in its own file (fwd_trace.py), named in `files`
    bwd_trace: str | None = json_field(None, written=False)
    input_meta: tuple[InputMeta, ...] = ()
    timing: Timing | None = None
    backward_timing: Timing | None = None
    outside_fusions_timing: Mapping[str, Timing] = dataclasses.field(default_factory=dict)
    error: str | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    host_timing: Timing | None = None
    host_backward_timing: Timing | None = None
    thunder_overhead_timing: Timing | None = None
    op_groups: tuple[OpGroup, ...] = ()
    compile_cost: CompileCost | None = None
    check: Check | None = None  # Thunder splits only
    triage: Triage | None = json_field(None, omit_default=True)
    minimized: Minimized | None = json_field(None, omit_default=True)
    sources: tuple[str, ...] = json_field((), omit_default=True)
    memory: Memory | None = json_field(None, omit_default=True)

    def fusions_in(self, phase: Phase | str) -> tuple[FusionRecord, ...]:
        return tuple(f for f in self.fusions if f.phase == Phase(phase))


@dataclasses.dataclass(frozen=True)
class GraphRecord(JsonRecord):
    """One Dynamo graph handed to the backend (a recompile of a frame gets its own record).

    `compile_id` is Dynamo's ("0/0", "0/1" for the first recompile of frame 0); `break_reason` is why Dynamo ended
    the graph where it did (None when the frame ended normally); `recompile_reason` the guard that failed, for
    recompiles. `fallback` is True when the graph ran without Thunder after an error (THUNDERFX_DEBUG_ON_ERROR).

    `compile_time_s` is the backend call alone; `compile_cost` what compiling the graph and its first forward and
    backward cost the host in all, in parts (see `CompileCost`). `host_timing`/`host_backward_timing` are the host
    wall time of the sampled calls where `timing` is device time (CUDA; None on CPU, where `timing` is host time).
    `period_timing` is the host wall time from the start of a sampled call to the start of the graph's next call:
    for a graph called once per step, the wall time of a training step. `disturbed` lists the sampled calls that the
    headline statistics leave out (see `Disturbance`); their samples stay in every timing of the graph.
    `source_excerpts` holds, by source line ("file:line function"), the code around each line its pieces name in
    their `sources` and `reads_saved_from`, read at flush (a file that could not be read has none). `memory` is what
    the graph held in memory on its sampled calls, all its splits together (see `Memory`). `timing_passed_over`
    counts the sampled calls that were not timed, to keep timing within THUNDERFX_DEBUG_TIMING_SHARE. `failure` is
    the exception the run raised in the graph (`error` holds its traceback), None where it raised none.
    """

    name: str
    index: int
    compile_id: str | None = None
    break_reason: str | None = None
    break_user_stack: tuple[str, ...] = ()
    recompile_reason: str | None = None
    node_count: int = 0
    input_meta: tuple[InputMeta, ...] = ()
    splits: tuple[SplitRecord, ...] = ()
    unattributed_reasons: tuple[SplitReason, ...] = ()
    calls: int = 0
    timing: Timing | None = None
    backward_timing: Timing | None = None
    error: str | None = None
    fallback: bool = False
    compile_time_s: float | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    compile_cost: CompileCost | None = None
    host_timing: Timing | None = None
    host_backward_timing: Timing | None = None
    period_timing: Timing | None = None
    disturbed: tuple[DisturbedCall, ...] = ()
    source_excerpts: Mapping[str, SourceExcerpt] = json_field(default_factory=dict, omit_default=True)
    memory: Memory | None = json_field(None, omit_default=True)
    timing_passed_over: int = json_field(0, omit_default=True)
    failure: RunFailure | None = json_field(None, omit_default=True)

    @property
    def reasons(self) -> tuple[SplitReason, ...]:
        """Every split reason of the graph, those attributed to an inductor split and those that were not."""
        return tuple(r for s in self.splits for r in s.reasons) + self.unattributed_reasons

    def split(self, name: str) -> SplitRecord:
        for split in self.splits:
            if split.name == name:
                return split
        raise KeyError(f"{self.name} has no split {name!r}; it has {[s.name for s in self.splits]}")

    def fusions(self) -> Iterator[tuple[SplitRecord, FusionRecord]]:
        for split in self.splits:
            for fusion in split.fusions:
                yield split, fusion

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **super().to_json()}  # each graph.json says its version too


@dataclasses.dataclass(frozen=True)
class RankRecord:
    """What the backend recorded about one process (rank) of a run: the records that renderers read.

    `meta` holds the manifest's facts: versions, config, rank, environment (secrets redacted), warnings.
    Users get it as a `thunderfx_debug.Report`, which adds the readable summary as `str(report)`.
    """

    graphs: tuple[GraphRecord, ...] = ()
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def rank(self) -> int:
        return int(self.meta.get("rank", 0))

    @functools.cached_property
    def collectives(self) -> CollectiveLog | None:
        """The rank's flight-recorder log of collectives (`meta["collectives"]`), None where it was not on."""
        data = self.meta.get("collectives")
        return None if data is None else CollectiveLog.from_json(data, "manifest.json.collectives")

    @functools.cached_property
    def step_memory(self) -> Memory | None:
        """What the sampled steps held in memory (`meta["memory_step"]`, see `recording.memory`): the saved bytes of
        every piece of a sampled step together, and on CUDA its peak above what was allocated when it started; None
        where nothing was measured (older dumps)."""
        data = self.meta.get("memory_step")
        return None if data is None else Memory.from_json(data, "manifest.json.memory_step")

    @functools.cached_property
    def flush_cost(self) -> FlushCost | None:
        """What the flush that wrote these records took, part by part (`meta["flush"]`); None for `report()` in the
        training process, or an older dump."""
        data = self.meta.get("flush")
        return None if data is None else FlushCost.from_json(data, "manifest.json.flush")

    @functools.cached_property
    def steps(self) -> Steps | None:
        """The training steps torch's optimizers counted (`meta["steps"]`, see `recording.steps`); None where no
        optimizer stepped after the first compile (or an older dump)."""
        data = self.meta.get("steps")
        return None if data is None else Steps.from_json(data, "manifest.json.steps")

    def graph(self, name: str) -> GraphRecord:
        for graph in self.graphs:
            if graph.name == name:
                return graph
        raise KeyError(f"no graph {name!r}; the report has {[g.name for g in self.graphs]}")


@dataclasses.dataclass(frozen=True)
class CollectiveCall(JsonRecord):
    """One collective of torch.distributed's flight recorder (`recording.collectives`): `name` as c10d profiles it
    ("nccl:all_reduce", "gloo:_reduce_scatter_base"), its process group and sequence number in that group (the same
    collective on every rank has the same pair), when the host enqueued it (`created_ns`, the system clock in ns since
    the epoch), the elements it sent (`elements`, summed over its inputs), and `duration_ms`, the device time between
    its start and end events where c10d timed it (NCCL with TORCH_NCCL_ENABLE_TIMING=1), else None."""

    name: str
    group: str
    seq: int
    created_ns: int
    elements: int = 0
    duration_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class CollectiveLog(JsonRecord):
    """The collectives a rank's flight recorder held at the flush (its last `capacity` ones at most), and where they
    came from (`source`: the c10d function read)."""

    source: str
    capacity: int
    calls: tuple[CollectiveCall, ...] = json_field((), columns=True, required=True)
