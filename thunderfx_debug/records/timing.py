"""What pieces cost in time: device- or host-time samples (`Timing`), the calls left out of the headline statistics
(`DisturbedCall`) and what a piece's first call cost (`CompileCost`).

Timings keep raw samples (all of them, or for a long run a bounded selection: see `Timing`); the statistics of
the contract (count, mean_ms, ...) are computed from them and from the totals over all samples.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import statistics
from collections.abc import Callable
from typing import Any

from thunderfx_debug.records.codec import DumpError, JsonRecord, decode_fields, json_field

#: Fewer headline samples than this and a median is not read as a piece's time: the figures made of it say "too few
#: samples" (`render.headline`), and a triage's time lost per step does not rest on it (`records.Triage`).
MIN_SAMPLES = 4


class ClockKind(str, enum.Enum):
    """What measured a sample: CUDA events on the device's stream, or the host's perf_counter (CPU runs)."""

    CUDA = "cuda"
    HOST = "host"


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
class SampleTotals(JsonRecord):
    """Streaming statistics over every sample of a piece, where more were taken than `Timing.samples_ms` keeps."""

    count: int
    total_ms: float
    min_ms: float
    max_ms: float


@dataclasses.dataclass(frozen=True)
class TimingWindow(JsonRecord):
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


@dataclasses.dataclass(frozen=True)
class Timing(JsonRecord):
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

    samples_ms: tuple[float, ...] = json_field((), required=True)
    calls: tuple[int, ...] = ()
    clock: ClockKind = ClockKind.CUDA
    # In the JSON, `all_samples` is the statistics written beside the samples (count, total_ms, min_ms, max_ms),
    # read back where `uniform` says the samples are a selection; the windows are written as columns.
    all_samples: SampleTotals | None = json_field(None, written=False)
    uniform: tuple[int, ...] | None = json_field(None, omit_default=True)
    windows: tuple[TimingWindow, ...] = json_field((), omit_default=True, columns=True)

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
    #: The statistics are written for people and other tools reading the JSON. On load they are computed again from
    #: the samples, except where `uniform` says the samples are a selection: then count, total_ms, min_ms and max_ms
    #: are the totals over all samples and are read back.
    JSON_DERIVED = STAT_NAMES

    def stats(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.STAT_NAMES}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Timing:
        fields = decode_fields(cls, data, where)
        samples, calls, uniform = fields["samples_ms"], fields.get("calls", ()), fields.get("uniform")
        if calls and len(calls) != len(samples):
            raise DumpError(f"{where}.calls: expected one call number per sample")
        if uniform is not None:
            if not all(0 <= i < len(samples) for i in uniform) or len(set(uniform)) != len(uniform):
                raise DumpError(f"{where}.uniform: expected distinct indices into samples_ms")
            totals = fields["all_samples"] = SampleTotals.from_json(data, where)
            if totals.count < len(samples):
                raise DumpError(f"{where}.count: {totals.count} samples in all, fewer than the {len(samples)} kept")
        return cls(**fields)


class Disturbance(str, enum.Enum):
    """Why a sampled call is left out of the headline statistics (its samples stay in the records):
    COMPILE: the process compiled something during the call (Dynamo's compile callbacks fired);
    PREEMPTED: the host thread waited for a CPU for more than a tenth of the call (Linux run-queue wait)."""

    COMPILE = "compile"
    PREEMPTED = "preempted"


@dataclasses.dataclass(frozen=True)
class DisturbedCall(JsonRecord):
    """Sampled call `call` of a graph was disturbed (`why`), which concerns the samples of every piece of the graph."""

    call: int
    why: Disturbance

    def __post_init__(self):
        object.__setattr__(self, "why", Disturbance(self.why))


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
class CostPart(JsonRecord):
    """`seconds` of host wall time of stage `what`, paid `when`."""

    when: CostWhen
    what: CostStage
    seconds: float

    def __post_init__(self):
        object.__setattr__(self, "when", CostWhen(self.when))
        object.__setattr__(self, "what", CostStage(self.what))


@dataclasses.dataclass(frozen=True)
class CompileCost(JsonRecord):
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


@dataclasses.dataclass(frozen=True)
class Steps(JsonRecord):
    """The training steps of the run as torch's optimizers counted them (`recording.steps`): `count` steps of the
    optimizer stepped most often, from the first compile of the run on (`optimizers` stepped in all), and `period`,
    the host wall time from one of its steps to the next (host clock, ms; `calls` are step numbers), those during
    which the process compiled something left out and counted in `compiled`. Per-step figures divide a graph's calls
    by `count`; the step's wall time is the headline of `period`."""

    count: int
    optimizers: int = 1
    period: Timing | None = None
    compiled: int = 0


class FlushStage(str, enum.Enum):
    """The parts of a flush that can take long, in the order a flush runs them."""

    READING = "reading the run"  # timing samples resolved, Thunder's traces read (the device waited for)
    TRIAGE = "triage"  # THUNDERFX_DEBUG_TRIAGE: pieces timed against inductor in processes of their own
    SCRIPTS = "repro scripts"  # THUNDERFX_DEBUG_REPRO's scripts and the inputs they load
    MINIMIZE = "minimizing"  # THUNDERFX_DEBUG_MINIMIZE: flagged pieces shrunk in processes of their own
    RECORDS = "building the records"


@dataclasses.dataclass(frozen=True)
class FlushPart(JsonRecord):
    """`seconds` of host wall time a flush spent on `stage`; `announced_s` what it said beforehand the part would
    take, where it said (the triage's estimate, the minimizer's budget)."""

    stage: FlushStage
    seconds: float
    announced_s: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "stage", FlushStage(self.stage))


@dataclasses.dataclass(frozen=True)
class FlushCost(JsonRecord):
    """What the flush that wrote a dump took before it wrote the files (their writing comes after the summary is
    made; the next flush's manifest has it, `last_flush`), part by part; `occasion` names the flush ("the flush at
    exit", "backend.flush()", ...). `triage_s` is the wall time every triage of the run took so far (a later flush
    finds its pieces triaged and times nothing again)."""

    occasion: str
    parts: tuple[FlushPart, ...] = ()
    triage_s: float | None = None

    @property
    def seconds(self) -> float:
        return math.fsum(p.seconds for p in self.parts)
