"""The report's records and their JSON form (the dump schema).

Plain frozen dataclasses: no torch or thunder import, so a dump can be read and rendered on a laptop.
Every record has `to_json()` and a `from_json()` that validates what it reads and raises `DumpError`
with the field that was wrong, so a damaged or foreign dump gives a clear message instead of a KeyError.

Timings keep raw samples (all of them, or for a long run a bounded selection: see `Timing`); the statistics of
the contract (count, mean_ms, ...) are computed from them and from the totals over all samples.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import statistics
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

#: Bumped whenever the JSON form changes incompatibly; `load_report` refuses versions it cannot read. Version 2: a
#: timing's `samples_ms` may be a selection of the samples (see `Timing`); older readers would count those alone.
SCHEMA_VERSION = 2
#: The versions `load_report` reads: version 1 dumps hold every sample raw, which version 2 reads as it is.
READABLE_SCHEMA_VERSIONS = (1, 2)


class DumpError(ValueError):
    """A dump directory or file that cannot be read: missing, damaged, or of another schema version."""


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
    OTHER = "other"  # `value` is its repr


class ClockKind(str, enum.Enum):
    """What measured a sample: CUDA events on the device's stream, or the host's perf_counter (CPU runs)."""

    CUDA = "cuda"
    HOST = "host"


T = TypeVar("T")


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    """Reads `data[key]`, checking its type; raises DumpError naming `where.key` otherwise."""
    if not isinstance(data, Mapping):
        raise DumpError(f"{where}: expected a JSON object, found {type(data).__name__}")
    if key not in data:
        if default is not ...:
            return default
        raise DumpError(f"{where}: missing field {key!r}")
    value = data[key]
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise DumpError(f"{where}.{key}: expected {_type_names(kind)}, found {type(value).__name__} {value!r:.80}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


def _str_list(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _get(data, key, list, where, default=[])
    if not all(isinstance(v, str) for v in values):
        raise DumpError(f"{where}.{key}: expected a list of strings")
    return tuple(values)


def _records(data: Mapping[str, Any], key: str, where: str, parse: Callable[[Any, str], T]) -> tuple[T, ...]:
    return tuple(parse(item, f"{where}.{key}[{i}]") for i, item in enumerate(_get(data, key, list, where, default=[])))


def _enum(enum_type: type[enum.Enum], value: Any, where: str):
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum_type)
        raise DumpError(f"{where}: {value!r} is not one of {allowed}") from None


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, statistics' "inclusive"); q in tenths.

    The arithmetic of `statistics.quantiles(..., n=10, method="inclusive")`, for one decile rather than all nine
    (a flush computes a few per window of every timed piece).

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9), percentile([7.0], 0.1)
        (4.6, 7.0)
    """
    if len(sorted_values) == 1:
        return sorted_values[0]
    j, delta = divmod(round(q * 10) * (len(sorted_values) - 1), 10)
    return (sorted_values[j] * (10 - delta) + sorted_values[j + 1] * delta) / 10


@dataclasses.dataclass(frozen=True)
class SampleTotals:
    """Streaming statistics over every sample of a piece, where more were taken than `Timing.samples_ms` keeps."""

    count: int
    total_ms: float
    min_ms: float
    max_ms: float


@dataclasses.dataclass(frozen=True)
class TimingWindow:
    """One stretch of a piece's samples over the run: `count` consecutive samples, taken on calls `first_call` to
    `last_call` of the piece's graph, with their median, 90th percentile and maximum (ms). The median and p90 are
    exact for windows of up to `recording.samples.WINDOW_VALUES` samples, else estimated from a sample of the window
    (see `recording.samples.WindowSeries`); `max_ms` is always exact."""

    first_call: int
    last_call: int
    count: int
    median_ms: float
    p90_ms: float
    max_ms: float


#: The columns of the JSON form of a timing's `windows` (one list per column).
WINDOW_COLUMNS = ("first_call", "last_call", "count", "median_ms", "p90_ms", "max_ms")


@dataclasses.dataclass(frozen=True)
class Timing:
    """Device-time samples of one piece (a graph call, a split call, a fusion region), in milliseconds.

    `samples_ms[i]` was measured on call `calls[i]` of the piece's graph (1-based), so samples of different pieces
    taken on the same call line up. `clock` says what measured them.

    A long run keeps a bounded selection of its samples raw (`recording.samples.SampleStream`): the first ones of
    the run, a uniform random sample of all of them (`uniform`: indices into `samples_ms`) and the most recent ones.
    Then `all_samples` holds the count, total, minimum and maximum over every sample, which `count`, `total_ms`,
    `mean_ms`, `min_ms` and `max_ms` report; `median_ms`, `p10_ms` and `p90_ms` are estimated from the uniform sample
    (exact while the run took no more samples than that sample holds). With `all_samples` None (a short run, or a
    version 1 dump) `samples_ms` are all the samples and every statistic is exact. `windows` is the time series of
    the samples over the run (`TimingWindow`), empty where it was not recorded.
    """

    samples_ms: tuple[float, ...] = ()
    calls: tuple[int, ...] = ()
    clock: ClockKind = ClockKind.CUDA
    all_samples: SampleTotals | None = None
    uniform: tuple[int, ...] | None = None
    windows: tuple[TimingWindow, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "clock", ClockKind(self.clock))  # "host" given as text is the same clock
        if (self.all_samples is None) != (self.uniform is None):
            raise ValueError("Timing: all_samples and uniform go together (both None: samples_ms are all the samples)")

    @functools.cached_property
    def by_call(self) -> dict[int, float]:
        """The kept samples by call number (renderers look samples up by call, piece after piece). Made once."""
        return dict(zip(self.calls or range(1, len(self.samples_ms) + 1), self.samples_ms))

    @property
    def complete(self) -> bool:
        """Whether `samples_ms` holds every sample of the piece (else a selection: see the class docstring)."""
        return self.all_samples is None

    @property
    def count(self) -> int:
        """Samples taken over the run (all of them, kept raw or not)."""
        return len(self.samples_ms) if self.all_samples is None else self.all_samples.count

    @property
    def uniform_samples_ms(self) -> tuple[float, ...]:
        """A uniform random sample of all the piece's samples (all of them for a complete timing): what quantiles
        and rank tests should read, unlike `samples_ms`, where the first and last samples of a run are overrepresented."""
        if self.uniform is None:
            return self.samples_ms
        return tuple(self.samples_ms[i] for i in self.uniform)

    def _quantile(self, fn: Callable[[list[float]], float]) -> float | None:
        values = self.uniform_samples_ms
        return fn(sorted(values)) if values else None

    @property
    def mean_ms(self) -> float | None:
        if self.all_samples is None:
            return statistics.fmean(self.samples_ms) if self.samples_ms else None
        return self.all_samples.total_ms / self.all_samples.count

    @property
    def median_ms(self) -> float | None:
        return self._quantile(statistics.median)

    @property
    def p10_ms(self) -> float | None:
        return self._quantile(lambda s: percentile(s, 0.10))

    @property
    def p90_ms(self) -> float | None:
        return self._quantile(lambda s: percentile(s, 0.90))

    @property
    def min_ms(self) -> float | None:
        if self.all_samples is None:
            return min(self.samples_ms) if self.samples_ms else None
        return self.all_samples.min_ms

    @property
    def max_ms(self) -> float | None:
        if self.all_samples is None:
            return max(self.samples_ms) if self.samples_ms else None
        return self.all_samples.max_ms

    @property
    def total_ms(self) -> float:
        return math.fsum(self.samples_ms) if self.all_samples is None else self.all_samples.total_ms

    STAT_NAMES = ("count", "mean_ms", "median_ms", "p10_ms", "p90_ms", "min_ms", "max_ms", "total_ms")

    def stats(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.STAT_NAMES}

    def to_json(self) -> dict[str, Any]:
        # The statistics are written for people and other tools reading the JSON. On load they are recomputed from
        # the samples, except where `uniform` says the samples are a selection: then count, total_ms, min_ms and
        # max_ms are the totals over all samples and are read back.
        data = {"clock": self.clock.value, "samples_ms": list(self.samples_ms), "calls": list(self.calls),
                **self.stats()}
        if self.uniform is not None:
            data["uniform"] = list(self.uniform)
        if self.windows:
            data["windows"] = {column: [getattr(w, column) for w in self.windows] for column in WINDOW_COLUMNS}
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> Timing:
        samples = _get(data, "samples_ms", list, where)
        calls = _get(data, "calls", list, where, default=[])
        if not all(_is_number(s) for s in samples):
            raise DumpError(f"{where}.samples_ms: expected a list of numbers")
        if calls and (len(calls) != len(samples) or not all(isinstance(c, int) for c in calls)):
            raise DumpError(f"{where}.calls: expected one call number per sample")
        clock = _enum(ClockKind, _get(data, "clock", str, where, default="cuda"), f"{where}.clock")
        totals, uniform = None, None
        if "uniform" in data:
            uniform = tuple(_get(data, "uniform", list, where))
            if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(samples) for i in uniform) \
                    or len(set(uniform)) != len(uniform):
                raise DumpError(f"{where}.uniform: expected distinct indices into samples_ms")
            number = (int, float)
            totals = SampleTotals(
                count=_get(data, "count", int, where),
                total_ms=float(_get(data, "total_ms", number, where)),
                min_ms=float(_get(data, "min_ms", number, where)),
                max_ms=float(_get(data, "max_ms", number, where)),
            )
            if totals.count < len(samples):
                raise DumpError(f"{where}.count: {totals.count} samples in all, fewer than the {len(samples)} kept")
        windows = _windows(_get(data, "windows", dict, where, default={}), f"{where}.windows")
        return cls(tuple(float(s) for s in samples), tuple(calls), clock, totals, uniform, windows)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _windows(columns: Mapping[str, Any], where: str) -> tuple[TimingWindow, ...]:
    if not columns:
        return ()
    lists = []
    for column in WINDOW_COLUMNS:
        values = _get(columns, column, list, where)
        integer = column in ("first_call", "last_call", "count")
        if not all(isinstance(v, int) and not isinstance(v, bool) if integer else _is_number(v) for v in values):
            raise DumpError(f"{where}.{column}: expected a list of {'whole numbers' if integer else 'numbers'}")
        lists.append(values)
    if len({len(values) for values in lists}) != 1:
        raise DumpError(f"{where}: its columns {', '.join(WINDOW_COLUMNS)} must have the same length")
    return tuple(TimingWindow(*row) for row in zip(*lists))


def _timing_or_none(data: Mapping[str, Any], key: str, where: str) -> Timing | None:
    value = _get(data, key, dict, where, default=None)
    return None if value is None else Timing.from_json(value, f"{where}.{key}")


def _timing_json(timing: Timing | None) -> dict[str, Any] | None:
    return None if timing is None else timing.to_json()


class CostWhen(str, enum.Enum):
    """When a part of a piece's compile cost was paid: before its first call (Dynamo and the backend call), in its
    first forward call, or in its first backward."""

    COMPILE = "compile"
    FORWARD = "forward"
    BACKWARD = "backward"


class CostStage(str, enum.Enum):
    """The parts of a compile cost that can be told apart (host wall time, perf_counter).

    - DYNAMO: Dynamo's compile of the frame, less the backend call (tracing the user's code, guards, bytecode).
    - BACKEND: the backend call (ThunderFX splitting the graph; inductor splits with dynamic shapes compile here).
    - THUNDER_TRACING: Thunder's interpreter and first passes over a split, at its first call (Thunder's compile stats).
    - THUNDER_TRANSFORMS: Thunder's transforms of the traces: autodiff, executor and fusion passes, forward/backward
      split, code generation (compile stats).
    - KERNEL_COMPILES: compiles Dynamo reports inside the first call (its compile callbacks): torch.compile of
      Thunder's TorchCompile regions, inductor's lazily compiled backward.
    - INDUCTOR_COMPILE: inductor compiling a split at its first call, with the real inputs.
    - FIRST_EXECUTION: the first execution, less the compiles seen inside it. nvFuser compiles its fusions here, at
      their first execution, and nothing reports that compile on its own: on CUDA most of this part is nvFuser's.
    """

    DYNAMO = "dynamo"
    BACKEND = "backend"
    THUNDER_TRACING = "thunder tracing"
    THUNDER_TRANSFORMS = "thunder transforms"
    KERNEL_COMPILES = "kernel compiles"
    INDUCTOR_COMPILE = "inductor compile"
    FIRST_EXECUTION = "first execution"


@dataclasses.dataclass(frozen=True)
class CostPart:
    """`seconds` of host wall time of stage `what`, paid `when`."""

    when: CostWhen
    what: CostStage
    seconds: float

    def __post_init__(self):
        object.__setattr__(self, "when", CostWhen(self.when))
        object.__setattr__(self, "what", CostStage(self.what))

    def to_json(self) -> dict[str, Any]:
        return {"when": self.when.value, "what": self.what.value, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CostPart:
        return cls(
            when=_enum(CostWhen, _get(data, "when", str, where), f"{where}.when"),
            what=_enum(CostStage, _get(data, "what", str, where), f"{where}.what"),
            seconds=float(_get(data, "seconds", (int, float), where)),
        )


@dataclasses.dataclass(frozen=True)
class CompileCost:
    """What compiling a graph or split and running it the first time cost the host (perf_counter, seconds).

    `forward_s` is the wall time of the piece's first forward call, `backward_s` that of its first backward (from its
    first autograd node to its last; None where it never ran). `parts` are the pieces of that time which can be told
    apart (`CostStage`); what they do not cover is the rest of those calls. `started_s` and `ended_s` place the cost on
    the run's host clock (seconds since the backend was built): a graph's starts with Dynamo's compile of its frame
    (with the backend call where Dynamo's start was not seen), a split's with its first call; both end with the end
    of the first backward (the first forward where there was none).
    """

    forward_s: float | None = None
    backward_s: float | None = None
    parts: tuple[CostPart, ...] = ()
    started_s: float | None = None
    ended_s: float | None = None

    def seconds(self, what: CostStage, when: CostWhen | None = None) -> float:
        return math.fsum(p.seconds for p in self.parts if p.what is what and (when is None or p.when is when))

    def to_json(self) -> dict[str, Any]:
        return {"forward_s": self.forward_s, "backward_s": self.backward_s, "parts": [p.to_json() for p in self.parts],
                "started_s": self.started_s, "ended_s": self.ended_s}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CompileCost:
        number = (int, float)
        return cls(
            forward_s=_get(data, "forward_s", number, where, default=None),
            backward_s=_get(data, "backward_s", number, where, default=None),
            parts=_records(data, "parts", where, CostPart.from_json),
            started_s=_get(data, "started_s", number, where, default=None),
            ended_s=_get(data, "ended_s", number, where, default=None),
        )


def _cost_or_none(data: Mapping[str, Any], where: str) -> CompileCost | None:
    value = _get(data, "compile_cost", dict, where, default=None)
    return None if value is None else CompileCost.from_json(value, f"{where}.compile_cost")


#: The op group of a split's time outside its fusion regions that no op opened: the start of a trace (unpacking its
#: inputs) and what follows a fusion region before the next op (Thunder's dels, views, bookkeeping).
BETWEEN_OPS = "between ops"


@dataclasses.dataclass(frozen=True)
class OpGroup:
    """The non-fusion work of a thunder split's trace of one phase, grouped by symbol and executor ("linear" run by
    "torch", "sdpa" by "cudnn"): `count` bound symbols of the trace, and the summed time of all of them on each
    sampled call (`timing`). An op's time runs from its mark to the next mark, so the views, dels and unpacks that
    follow an op (they launch no kernel) count with it. `symbol` BETWEEN_OPS (executor "thunder") is the rest of the
    time outside the regions; the groups of a phase and its regions add up to the trace's time."""

    symbol: str
    executor: str
    phase: Phase
    count: int = 0
    timing: Timing | None = None

    def __post_init__(self):
        object.__setattr__(self, "phase", Phase(self.phase))

    @property
    def label(self) -> str:
        """"linear [torch]": the group's name in reports."""
        return f"{self.symbol} [{self.executor}]"

    def to_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "executor": self.executor, "phase": self.phase.value, "count": self.count,
                "timing": _timing_json(self.timing)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> OpGroup:
        return cls(
            symbol=_get(data, "symbol", str, where),
            executor=_get(data, "executor", str, where, default=""),
            phase=_enum(Phase, _get(data, "phase", str, where), f"{where}.phase"),
            count=_get(data, "count", int, where, default=0),
            timing=_timing_or_none(data, "timing", where),
        )


class Disturbance(str, enum.Enum):
    """Why a sampled call is left out of the headline statistics (its samples stay in the records):
    COMPILE: the process compiled something during the call (Dynamo's compile callbacks fired);
    PREEMPTED: the host thread waited for a CPU for more than a tenth of the call (Linux run-queue wait)."""

    COMPILE = "compile"
    PREEMPTED = "preempted"


@dataclasses.dataclass(frozen=True)
class DisturbedCall:
    """Sampled call `call` of a graph was disturbed (`why`), which concerns the samples of every piece of the graph."""

    call: int
    why: Disturbance

    def __post_init__(self):
        object.__setattr__(self, "why", Disturbance(self.why))

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call, "why": self.why.value}

    @classmethod
    def from_json(cls, data: Any, where: str) -> DisturbedCall:
        return cls(_get(data, "call", int, where), _enum(Disturbance, _get(data, "why", str, where), f"{where}.why"))


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
class InputMeta:
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
    parameter: bool = False  # an nn.Parameter in the run (compiled code may guard on the type)
    alias_of: int | None = None  # the first input of the same call whose storage this tensor shares in the run

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

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["kind"], data["shape"], data["stride"] = self.kind.value, list(self.shape), list(self.stride)
        if not self.parameter:
            del data["parameter"]  # written only where it is one
        if self.alias_of is None:
            del data["alias_of"]
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> InputMeta:
        """Reads one input's record; fields that older dumps lack take their defaults."""
        kind = _enum(InputKind, _get(data, "kind", str, where), f"{where}.kind")
        shape = _get(data, "shape", list, where, default=[])
        stride = _get(data, "stride", list, where, default=[])
        if not all(isinstance(v, int) for v in [*shape, *stride]):
            raise DumpError(f"{where}: shape and stride must be lists of integers")
        number = (int, float, bool)
        return cls(
            kind=kind,
            shape=tuple(shape),
            stride=tuple(stride),
            storage_offset=_get(data, "storage_offset", int, where, default=0),
            dtype=_get(data, "dtype", str, where, default=""),
            device=_get(data, "device", str, where, default=""),
            requires_grad=_get(data, "requires_grad", bool, where, default=False),
            min_value=_get(data, "min_value", number, where, default=None),
            max_value=_get(data, "max_value", number, where, default=None),
            value=data.get("value"),
            storage_size=_get(data, "storage_size", int, where, default=None),
            nonnegative_min=_get(data, "nonnegative_min", int, where, default=None),
            sentinel=_get(data, "sentinel", int, where, default=None),
            sentinel_fraction=_get(data, "sentinel_fraction", (int, float), where, default=None),
            true_fraction=_get(data, "true_fraction", (int, float), where, default=None),
            index_bound=_get(data, "index_bound", int, where, default=None),
            parameter=_get(data, "parameter", bool, where, default=False),
            alias_of=_get(data, "alias_of", int, where, default=None),
        )


@dataclasses.dataclass(frozen=True)
class SplitReason:
    """Why ThunderFX sent an op to inductor. `type` is thunder's SplitReasonType name (e.g. "MISSING_OP_SUPPORT").

    `op` is the FX node that caused it (None where thunder's message names none); `exception` is the text of the
    exception that thunder caught while checking the op, which thunder's own string form of the reasons drops.
    """

    type: str
    info: str
    exception: str | None = None
    node: str | None = None
    op: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str) -> SplitReason:
        return cls(
            type=_get(data, "type", str, where),
            info=_get(data, "info", str, where, default=""),
            exception=_get(data, "exception", str, where, default=None),
            node=_get(data, "node", str, where, default=None),
            op=_get(data, "op", str, where, default=None),
        )


def _number_or_none(data: Mapping[str, Any], key: str, where: str) -> float | None:
    value = _get(data, key, (int, float), where, default=None)
    return None if value is None else float(value)


#: Reasons a check keeps at most (distinct ones; the first reasons are the informative ones).
MAX_CHECK_REASONS = 8


@dataclasses.dataclass(frozen=True)
class Check:
    """What the correctness sentinel (THUNDERFX_DEBUG_CHECK) found for one piece: a Thunder split, or a fusion
    region at `fusion` level. None on a record where nothing was checked.

    `calls` is the number of checked calls of the piece, `mismatches` how many of them had a value beyond the
    tolerance (or a value that changed after the piece returned it), `first_mismatch_call` the first of those
    (calls are 1-based call numbers of the piece's graph); `compared` counts the values compared over all calls.
    The worst value is the one whose error was the largest fraction of what was allowed (`worst_ratio`; above 1
    is a mismatch): `worst_output` names it ("forward output 2", "gradient of input 5 (l_w_)"), `worst_call` is
    its call, `worst_abs_error` its largest absolute error, `worst_rel_error` that error over the largest magnitude
    of its reference. The tolerance used for it: `rtol`, `atol` (its dtype's), `allowed` (the absolute error
    allowed: rtol * M + atol * min(1, M), M the reference's largest magnitude, plus three times eager's own error
    against float64 where the float64 reference was needed), `reference` ("eager", "float64 eager", "exact", or "its own value right after it
    returned"). `mismatched_values` names the values that were beyond tolerance (the first few distinct ones);
    `skipped` says why values were not compared (random ops, inputs changed in place, a backward that never ran, a
    gradient whose capture could not be verified, ...). `failures` counts the checked calls on which the check
    itself failed (an error of the sentinel, logged; what it did compare before still counts) and `failed` says what
    failed (the first few distinct ones): such a piece is never counted as checked clean. `verified_gradients` counts
    the gradients whose capture was proved to be what autograd delivered to the input (see
    `recording.split_check`). A fusion region has `writes_unowned_memory` where a value it does not own (another
    region's output, an input of the split) changed while it ran with no write PyTorch knows of, and `overwritten`
    where a value it returned changed that way after it returned it (the region that wrote it is named on the next
    checked call).
    """

    calls: int = 0
    mismatches: int = 0
    compared: int = 0
    first_mismatch_call: int | None = None
    worst_output: str | None = None
    worst_call: int | None = None
    worst_abs_error: float | None = None
    worst_rel_error: float | None = None
    worst_ratio: float | None = None
    rtol: float | None = None
    atol: float | None = None
    allowed: float | None = None
    reference: str | None = None
    skipped: tuple[str, ...] = ()
    mismatched_values: tuple[str, ...] = ()
    failures: int = 0
    failed: tuple[str, ...] = ()
    verified_gradients: int = 0
    writes_unowned_memory: bool = False
    overwritten: bool = False

    @property
    def mismatched(self) -> bool:
        return self.mismatches > 0

    @property
    def clean(self) -> bool:
        """Values were compared, none mismatched, and the check never failed."""
        return self.compared > 0 and not self.mismatches and not self.failures

    def describe(self) -> str:
        """One line: "3 checked calls, 1 mismatch (first at call 51): forward output 2 at call 51, error 0.31
        (rel 0.05) against 0.0125 allowed (bfloat16 rtol 0.05, atol 0.05, float64 eager)"."""
        line = f"{self.calls} checked call{'s' if self.calls != 1 else ''}"
        if self.mismatches:
            line += (f", {self.mismatches} mismatch{'es' if self.mismatches != 1 else ''}"
                     f" (first at call {self.first_mismatch_call})")
        else:
            line += ", no mismatch" if self.compared else ", nothing compared"
        if self.worst_output is not None:
            line += (f"; worst: {self.worst_output} at call {self.worst_call}, error {_g(self.worst_abs_error)} "
                     f"(relative {_g(self.worst_rel_error)}) against {_g(self.allowed)} allowed "
                     f"(rtol {_g(self.rtol)}, atol {_g(self.atol)}, against {self.reference}): "
                     f"{_g(self.worst_ratio)} of the tolerance")
        if self.skipped:
            line += "; not compared: " + "; ".join(self.skipped)
        if self.failures:
            line += (f"; the check failed on {self.failures} call{'s' if self.failures != 1 else ''}: "
                     + "; ".join(self.failed))
        return line

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["skipped"] = list(self.skipped)
        data["mismatched_values"] = list(self.mismatched_values)
        data["failed"] = list(self.failed)
        # JSON has no infinity: a value that changed or an integer that differs is "inf" in the text
        return {k: (_json_float(v) if isinstance(v, float) else v) for k, v in data.items()}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Check:
        def count(key: str) -> int:
            value = _get(data, key, int, where, default=0)
            if value < 0:
                raise DumpError(f"{where}.{key}: expected a count >= 0, found {value}")
            return value

        def number(key: str) -> float | None:
            value = data.get(key) if isinstance(data, Mapping) else None
            if isinstance(value, str) and value in ("inf", "nan"):
                return float(value)
            return _number_or_none(data, key, where)

        return cls(
            calls=count("calls"),
            mismatches=count("mismatches"),
            compared=count("compared"),
            first_mismatch_call=_get(data, "first_mismatch_call", int, where, default=None),
            worst_output=_get(data, "worst_output", str, where, default=None),
            worst_call=_get(data, "worst_call", int, where, default=None),
            worst_abs_error=number("worst_abs_error"),
            worst_rel_error=number("worst_rel_error"),
            worst_ratio=number("worst_ratio"),
            rtol=number("rtol"),
            atol=number("atol"),
            allowed=number("allowed"),
            reference=_get(data, "reference", str, where, default=None),
            skipped=_str_list(data, "skipped", where),
            mismatched_values=_str_list(data, "mismatched_values", where),
            failures=count("failures"),
            failed=_str_list(data, "failed", where),
            verified_gradients=count("verified_gradients"),
            writes_unowned_memory=_get(data, "writes_unowned_memory", bool, where, default=False),
            overwritten=_get(data, "overwritten", bool, where, default=False),
        )


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _check_or_none(data: Mapping[str, Any], where: str) -> Check | None:
    value = _get(data, "check", dict, where, default=None)
    return None if value is None else Check.from_json(value, f"{where}.check")


@dataclasses.dataclass(frozen=True)
class Triage:
    """A piece timed against inductor at flush, in the training process, on the inputs of a recorded call.

    `thunder_ms` and `inductor_ms` are ms per call on `clock` (median of the rounds; a split's forward and backward
    together, a fusion region's call), `ratio` Thunder's time over inductor's with its 95% interval
    [`ratio_low`, `ratio_high`] (Yuen's trimmed t on the rounds' log times, the two sides interleaved), `deviates`
    when the whole interval lies beyond `deviation` (slower) or below 1/`deviation` (faster). `ms_per_step` is the
    time Thunder loses there per training step against inductor, (thunder_ms - inductor_ms) x `calls_per_step`
    (negative: it gains). `inputs` says where the inputs came from ("real": the run's tensors; "meta": rebuilt from
    the recorded metadata; "the run's tensors" where they were all alive). `error` says why a piece could not be
    judged (then no figures), whole. `compile_s` is what compiling inductor's counterpart and both sides' first calls
    took, `timing_s` the rounds."""

    clock: ClockKind = ClockKind.HOST
    thunder_ms: float | None = None
    inductor_ms: float | None = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    deviation: float = 1.2
    deviates: bool = False
    calls_per_step: float = 1.0
    rounds: int = 0
    inputs: str = "meta"
    error: str | None = None
    compile_s: float | None = None
    timing_s: float | None = None

    @property
    def ms_per_step(self) -> float:
        if self.thunder_ms is None or self.inductor_ms is None:
            return 0.0
        return (self.thunder_ms - self.inductor_ms) * self.calls_per_step

    @property
    def why(self) -> str | None:
        """"slower_than_inductor" or "faster_than_inductor" for a deviating piece (its scripts' names say so)."""
        if not self.deviates or self.ratio is None:
            return None
        return "slower_than_inductor" if self.ratio > 1 else "faster_than_inductor"

    def to_json(self) -> dict[str, Any]:
        return {"clock": self.clock.value, "thunder_ms": self.thunder_ms, "inductor_ms": self.inductor_ms,
                "ratio": self.ratio, "ratio_low": self.ratio_low, "ratio_high": self.ratio_high,
                "deviation": self.deviation, "deviates": self.deviates, "calls_per_step": self.calls_per_step,
                "ms_per_step": self.ms_per_step, "rounds": self.rounds, "inputs": self.inputs, "error": self.error,
                "compile_s": self.compile_s, "timing_s": self.timing_s}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Triage:
        def number(key, default=None):
            value = _get(data, key, (int, float), where, default=default)
            return None if value is None else float(value)

        return cls(
            clock=_enum(ClockKind, _get(data, "clock", str, where, default="host"), f"{where}.clock"),
            thunder_ms=number("thunder_ms"), inductor_ms=number("inductor_ms"), ratio=number("ratio"),
            ratio_low=number("ratio_low"), ratio_high=number("ratio_high"), deviation=number("deviation", 1.2),
            deviates=_get(data, "deviates", bool, where, default=False),
            calls_per_step=number("calls_per_step", 1.0), rounds=_get(data, "rounds", int, where, default=0),
            inputs=_get(data, "inputs", str, where, default="meta"), error=_get(data, "error", str, where, default=None),
            compile_s=number("compile_s"), timing_s=number("timing_s"),
        )


def _triage_or_none(data: Mapping[str, Any], where: str) -> Triage | None:
    value = _get(data, "triage", dict, where, default=None)
    return None if value is None else Triage.from_json(value, f"{where}.triage")


@dataclasses.dataclass(frozen=True)
class Minimized:
    """A piece the sentinel flagged, shrunk at flush (THUNDERFX_DEBUG_MINIMIZE=1) to the fewest ops that still fail
    the same way: `ops_before` -> `ops_after` (and its inputs and outputs), in `trials` runs of cuts of it (child
    processes) and `seconds`; `script` the minimal script's path in the dump. `verdict` is the full piece's RESULT
    line, `final` the minimal script's. Where nothing was written (`script` None), `note` says why (the piece did
    not fail outside the training process, failed at random, ...); `budget_spent` where its time ran out first."""

    ops_before: int
    ops_after: int | None = None
    inputs_before: int = 0
    inputs_after: int | None = None
    outputs_before: int = 0
    outputs_after: int | None = None
    trials: int = 0
    seconds: float = 0.0
    script: str | None = None
    verdict: str = ""
    final: str = ""
    kept: tuple[str, ...] = ()
    budget_spent: bool = False
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["kept"] = list(self.kept)
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> Minimized:
        def count(key: str, default: int | None = 0) -> int | None:
            value = _get(data, key, int, where, default=default)
            if value is not None and value < 0:
                raise DumpError(f"{where}.{key}: expected a count >= 0, found {value}")
            return value

        return cls(
            ops_before=count("ops_before", ...), ops_after=count("ops_after", None),
            inputs_before=count("inputs_before"), inputs_after=count("inputs_after", None),
            outputs_before=count("outputs_before"), outputs_after=count("outputs_after", None),
            trials=count("trials"), seconds=float(_get(data, "seconds", (int, float), where, default=0.0)),
            script=_get(data, "script", str, where, default=None),
            verdict=_get(data, "verdict", str, where, default=""),
            final=_get(data, "final", str, where, default=""), kept=_str_list(data, "kept", where),
            budget_spent=_get(data, "budget_spent", bool, where, default=False),
            note=_get(data, "note", str, where, default=""),
        )


def _minimized_or_none(data: Mapping[str, Any], where: str) -> Minimized | None:
    value = _get(data, "minimized", dict, where, default=None)
    return None if value is None else Minimized.from_json(value, f"{where}.minimized")


@dataclasses.dataclass(frozen=True)
class FusionRecord:
    """A fusion region of a Thunder trace: `nvFusionN` (nvFuser) or `TorchCompileN` (Thunder's torch.compile executor).

    `ops` are the symbols fused into the region in trace order; `inputs`/`outputs` are the trace names of its
    arguments and results, `input_meta` their metadata where known.
    """

    name: str
    executor: str
    phase: Phase
    ops: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    input_meta: tuple[InputMeta, ...] = ()
    timing: Timing | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Check | None = None
    triage: Triage | None = None
    minimized: Minimized | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.name}_{self.phase.value}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "executor": self.executor,
            "phase": self.phase.value,
            "ops": list(self.ops),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "input_meta": [m.to_json() for m in self.input_meta],
            "timing": _timing_json(self.timing),
            "files": dict(self.files),
            "check": None if self.check is None else self.check.to_json(),
            **({} if self.triage is None else {"triage": self.triage.to_json()}),
            **({} if self.minimized is None else {"minimized": self.minimized.to_json()}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> FusionRecord:
        return cls(
            name=_get(data, "name", str, where),
            executor=_get(data, "executor", str, where, default=""),
            phase=_enum(Phase, _get(data, "phase", str, where), f"{where}.phase"),
            ops=_str_list(data, "ops", where),
            inputs=_str_list(data, "inputs", where),
            outputs=_str_list(data, "outputs", where),
            input_meta=_records(data, "input_meta", where, InputMeta.from_json),
            timing=_timing_or_none(data, "timing", where),
            files=_files(data, where),
            check=_check_or_none(data, where),
            triage=_triage_or_none(data, where),
            minimized=_minimized_or_none(data, where),
        )


def _files(data: Mapping[str, Any], where: str) -> dict[str, str]:
    files = _get(data, "files", dict, where, default={})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise DumpError(f"{where}.files: expected a mapping of strings to relative paths")
    return dict(files)


@dataclasses.dataclass(frozen=True)
class SplitRecord:
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
    """

    name: str
    kind: SplitKind
    ops: tuple[str, ...] = ()
    reasons: tuple[SplitReason, ...] = ()
    fusions: tuple[FusionRecord, ...] = ()
    fwd_trace: str | None = None
    bwd_trace: str | None = None
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
    triage: Triage | None = None
    minimized: Minimized | None = None

    def fusions_in(self, phase: Phase | str) -> tuple[FusionRecord, ...]:
        return tuple(f for f in self.fusions if f.phase == Phase(phase))

    def to_json(self) -> dict[str, Any]:
        # Traces live in their own files (fwd_trace.py, bwd_trace.py), named in `files`.
        return {
            "name": self.name,
            "kind": self.kind.value,
            "ops": list(self.ops),
            "reasons": [r.to_json() for r in self.reasons],
            "fusions": [f.to_json() for f in self.fusions],
            "input_meta": [m.to_json() for m in self.input_meta],
            "timing": _timing_json(self.timing),
            "backward_timing": _timing_json(self.backward_timing),
            "outside_fusions_timing": {k: v.to_json() for k, v in self.outside_fusions_timing.items()},
            "error": self.error,
            "files": dict(self.files),
            "host_timing": _timing_json(self.host_timing),
            "host_backward_timing": _timing_json(self.host_backward_timing),
            "thunder_overhead_timing": _timing_json(self.thunder_overhead_timing),
            "op_groups": [g.to_json() for g in self.op_groups],
            "compile_cost": None if self.compile_cost is None else self.compile_cost.to_json(),
            "check": None if self.check is None else self.check.to_json(),
            **({} if self.triage is None else {"triage": self.triage.to_json()}),
            **({} if self.minimized is None else {"minimized": self.minimized.to_json()}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str, traces: Mapping[str, str | None] | None = None) -> SplitRecord:
        traces = traces or {}
        outside = _get(data, "outside_fusions_timing", dict, where, default={})
        return cls(
            name=_get(data, "name", str, where),
            kind=_enum(SplitKind, _get(data, "kind", str, where), f"{where}.kind"),
            ops=_str_list(data, "ops", where),
            reasons=_records(data, "reasons", where, SplitReason.from_json),
            fusions=_records(data, "fusions", where, FusionRecord.from_json),
            fwd_trace=traces.get("fwd_trace"),
            bwd_trace=traces.get("bwd_trace"),
            input_meta=_records(data, "input_meta", where, InputMeta.from_json),
            timing=_timing_or_none(data, "timing", where),
            backward_timing=_timing_or_none(data, "backward_timing", where),
            outside_fusions_timing={
                k: Timing.from_json(v, f"{where}.outside_fusions_timing.{k}") for k, v in outside.items()
            },
            error=_get(data, "error", str, where, default=None),
            files=_files(data, where),
            host_timing=_timing_or_none(data, "host_timing", where),
            host_backward_timing=_timing_or_none(data, "host_backward_timing", where),
            thunder_overhead_timing=_timing_or_none(data, "thunder_overhead_timing", where),
            op_groups=_records(data, "op_groups", where, OpGroup.from_json),
            compile_cost=_cost_or_none(data, where),
            check=_check_or_none(data, where),
            triage=_triage_or_none(data, where),
            minimized=_minimized_or_none(data, where),
        )


@dataclasses.dataclass(frozen=True)
class GraphRecord:
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
        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "index": self.index,
            "compile_id": self.compile_id,
            "break_reason": self.break_reason,
            "break_user_stack": list(self.break_user_stack),
            "recompile_reason": self.recompile_reason,
            "node_count": self.node_count,
            "input_meta": [m.to_json() for m in self.input_meta],
            "splits": [s.to_json() for s in self.splits],
            "unattributed_reasons": [r.to_json() for r in self.unattributed_reasons],
            "calls": self.calls,
            "timing": _timing_json(self.timing),
            "backward_timing": _timing_json(self.backward_timing),
            "error": self.error,
            "fallback": self.fallback,
            "compile_time_s": self.compile_time_s,
            "files": dict(self.files),
            "compile_cost": None if self.compile_cost is None else self.compile_cost.to_json(),
            "host_timing": _timing_json(self.host_timing),
            "host_backward_timing": _timing_json(self.host_backward_timing),
            "period_timing": _timing_json(self.period_timing),
            "disturbed": [d.to_json() for d in self.disturbed],
        }

    @classmethod
    def from_json(
        cls, data: Any, where: str, split_traces: Mapping[str, Mapping[str, str | None]] | None = None
    ) -> GraphRecord:
        split_traces = split_traces or {}
        splits = tuple(
            SplitRecord.from_json(item, f"{where}.splits[{i}]", split_traces.get(_get(item, "name", str, where)))
            for i, item in enumerate(_get(data, "splits", list, where, default=[]))
        )
        return cls(
            name=_get(data, "name", str, where),
            index=_get(data, "index", int, where),
            compile_id=_get(data, "compile_id", str, where, default=None),
            break_reason=_get(data, "break_reason", str, where, default=None),
            break_user_stack=_str_list(data, "break_user_stack", where),
            recompile_reason=_get(data, "recompile_reason", str, where, default=None),
            node_count=_get(data, "node_count", int, where, default=0),
            input_meta=_records(data, "input_meta", where, InputMeta.from_json),
            splits=splits,
            unattributed_reasons=_records(data, "unattributed_reasons", where, SplitReason.from_json),
            calls=_get(data, "calls", int, where, default=0),
            timing=_timing_or_none(data, "timing", where),
            backward_timing=_timing_or_none(data, "backward_timing", where),
            error=_get(data, "error", str, where, default=None),
            fallback=_get(data, "fallback", bool, where, default=False),
            compile_time_s=_get(data, "compile_time_s", (int, float), where, default=None),
            files=_files(data, where),
            compile_cost=_cost_or_none(data, where),
            host_timing=_timing_or_none(data, "host_timing", where),
            host_backward_timing=_timing_or_none(data, "host_backward_timing", where),
            period_timing=_timing_or_none(data, "period_timing", where),
            disturbed=_records(data, "disturbed", where, DisturbedCall.from_json),
        )


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

    def graph(self, name: str) -> GraphRecord:
        for graph in self.graphs:
            if graph.name == name:
                return graph
        raise KeyError(f"no graph {name!r}; the report has {[g.name for g in self.graphs]}")


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
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


#: The columns of the JSON form of a `CollectiveLog`'s calls.
COLLECTIVE_COLUMNS = ("name", "group", "seq", "created_ns", "elements", "duration_ms")


@dataclasses.dataclass(frozen=True)
class CollectiveLog:
    """The collectives a rank's flight recorder held at the flush (its last `capacity` ones at most), and where they
    came from (`source`: the c10d function read)."""

    source: str
    capacity: int
    calls: tuple[CollectiveCall, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "capacity": self.capacity,
                "calls": {column: [getattr(c, column) for c in self.calls] for column in COLLECTIVE_COLUMNS}}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CollectiveLog:
        columns = _get(data, "calls", dict, where)
        kinds = {"name": str, "group": str, "seq": int, "created_ns": int, "elements": int,
                 "duration_ms": (int, float, type(None))}
        lists = []
        for column in COLLECTIVE_COLUMNS:
            values = _get(columns, column, list, f"{where}.calls")
            if not all(isinstance(v, kinds[column]) and not isinstance(v, bool) for v in values):
                raise DumpError(f"{where}.calls.{column}: expected a list of {_type_names(kinds[column])}")
            lists.append(values)
        if len({len(values) for values in lists}) != 1:
            raise DumpError(f"{where}.calls: its columns {', '.join(COLLECTIVE_COLUMNS)} must have the same length")
        calls = tuple(CollectiveCall(n, g, s, c, e, None if d is None else float(d)) for n, g, s, c, e, d in zip(*lists))
        return cls(_get(data, "source", str, where), _get(data, "capacity", int, where), calls)
