"""What the backend judged about a piece: the correctness sentinel's `Check`, flush-time `Triage` against inductor,
and the `Minimized` script of a piece the sentinel flagged."""

from __future__ import annotations

import dataclasses

from thunderfx_debug.records.codec import Count, JsonRecord, json_field
from thunderfx_debug.records.memory import Memory
from thunderfx_debug.records.timing import MIN_SAMPLES, ClockKind

#: The Thunder/inductor time ratio beyond which a triaged piece deviates, either way: THUNDERFX_DEBUG_DEVIATION's
#: default, and the deviation of a triage record that does not say its own.
DEVIATION = 1.2


def deviation_outcome(low: float, high: float, deviation: float) -> str:
    """Where a Thunder/inductor time ratio, or its interval [`low`, `high`], lies against `deviation`
    (THUNDERFX_DEBUG_DEVIATION): "deviates" (wholly beyond it either way: above `deviation` or below its inverse),
    "within" (wholly inside [1/`deviation`, `deviation`]), else "undecided". The one rule by which the flush-time
    triage (an interval over rounds), `thunderfx-debug bench` (a point ratio: `low` = `high`) and the triage's
    comparison with the run's own time judge a ratio.

    Example:
        >>> deviation_outcome(1.25, 1.25, 1.2), deviation_outcome(0.9, 1.1, 1.2), deviation_outcome(1.1, 1.3, 1.2)
        ('deviates', 'within', 'undecided')
        >>> deviation_outcome(0.5, 0.8, 1.2)  # faster beyond it: deviates too
        'deviates'
    """
    if low > deviation or high < 1 / deviation:
        return "deviates"
    return "within" if 1 / deviation <= low and high <= deviation else "undecided"


#: Reasons a check keeps at most (distinct ones; the first reasons are the informative ones).
MAX_CHECK_REASONS = 8


@dataclasses.dataclass(frozen=True)
class Check(JsonRecord):
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
    checked call). `passed_over` counts a split's scheduled calls that it did not check, to keep the sentinel within
    its share of the training's time (`recording.turns.Turns`; its regions were passed over with it).
    """

    calls: Count = 0
    mismatches: Count = 0
    compared: Count = 0
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
    failures: Count = 0
    failed: tuple[str, ...] = ()
    verified_gradients: Count = 0
    writes_unowned_memory: bool = False
    overwritten: bool = False
    passed_over: Count = 0

    @property
    def mismatched(self) -> bool:
        return self.mismatches > 0

    @property
    def partly_compared(self) -> bool:
        """Some values were compared and others were not (`skipped` says why): what was compared may be clean, but
        the piece was not all checked."""
        return self.compared > 0 and bool(self.skipped)

    @property
    def clean(self) -> bool:
        """Checked clean: values were compared, none mismatched, none was left uncompared, and the check never
        failed."""
        return self.compared > 0 and not self.skipped and not self.mismatches and not self.failures


@dataclasses.dataclass(frozen=True)
class Triage(JsonRecord):
    """A piece timed against inductor at flush, in a process of its own, on the inputs of a recorded call.

    `thunder_ms` and `inductor_ms` are ms per call on `clock` (median of the rounds; a split's forward and backward
    together, a fusion region's call), `ratio` Thunder's time over inductor's with its 95% interval
    [`ratio_low`, `ratio_high`] (Yuen's trimmed t on the rounds' log times, the two sides interleaved), `deviates`
    when the whole interval lies beyond `deviation` (slower) or below 1/`deviation` (faster). `run_ms` is the run's own
    time per call of the piece on the same clock: the headline median of its sampled calls (`render.headline`: the
    first and those the process compiled or was preempted in left out; a split's forward and backward paired by
    call), over `run_samples` samples; None where the run sampled none (THUNDERFX_DEBUG_TIMING below the piece's
    level). `calls_per_step` is how often the piece runs in a training step (`render.digest.steps`). `ms_per_step`
    is the time Thunder loses there per training step against inductor (negative: it gains): from the run's own
    time where it rests on at least `MIN_SAMPLES` samples, `run_ms` x (1 - 1/`ratio`) x `calls_per_step`, else from
    the triage's own times, (thunder_ms - inductor_ms) x `calls_per_step`. `inputs` says
    where the inputs came from ("real": the run's captured call; "meta": rebuilt from the recorded metadata; "the
    run's tensors" where they were all alive). `error` says why a piece could not be judged (then no figures),
    whole; `died` where the process that timed it died (or was ended past its time limit) in it. `compile_s` is what
    compiling inductor's counterpart and both sides' first calls took, `timing_s` the rounds. A split's
    `thunder_memory` and `inductor_memory` are what each side held on one call in that process, on the same inputs
    (saved bytes; on CUDA the peaks of its forward and backward too; see `Memory`), None where not measured."""

    JSON_DERIVED = ("ms_per_step",)  # for readers of the JSON; computed again on load

    clock: ClockKind = ClockKind.HOST
    thunder_ms: float | None = None
    inductor_ms: float | None = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    deviation: float = DEVIATION
    deviates: bool = False
    calls_per_step: float = 1.0
    rounds: int = 0
    inputs: str = "meta"
    error: str | None = None
    compile_s: float | None = None
    timing_s: float | None = None
    # Written only where set (older readers never saw them).
    run_ms: float | None = json_field(None, omit_default=True)
    run_samples: Count = json_field(0, omit_default=True)
    died: bool = json_field(False, omit_default=True)
    thunder_memory: Memory | None = json_field(None, omit_default=True)
    inductor_memory: Memory | None = json_field(None, omit_default=True)

    @property
    def lost_from_the_run(self) -> bool:
        """Whether `ms_per_step` comes from the run's own time of the piece (`run_ms`, the headline median of its
        `run_samples` sampled calls, at least `MIN_SAMPLES` of them) rather than from the triage's rounds alone."""
        return self.run_ms is not None and bool(self.ratio) and self.run_samples >= MIN_SAMPLES

    @property
    def run_too_thin(self) -> bool:
        """Whether the run sampled the piece, but too rarely for its time to be used (`ms_per_step` then comes from
        the triage's own times, and the run's is not set against them)."""
        return self.run_ms is not None and self.run_samples < MIN_SAMPLES

    @property
    def ms_per_step(self) -> float:
        if self.lost_from_the_run:
            return self.run_ms * (1 - 1 / self.ratio) * self.calls_per_step
        if self.thunder_ms is None or self.inductor_ms is None:
            return 0.0
        return (self.thunder_ms - self.inductor_ms) * self.calls_per_step

    @property
    def against_the_run(self) -> float | None:
        """The piece's time in its process of its own over the run's own time of it (None where the run has none)."""
        if self.run_ms is None or self.thunder_ms is None or self.run_ms <= 0:
            return None
        return self.thunder_ms / self.run_ms

    @property
    def unlike_the_run(self) -> bool:
        """Whether the piece's time in its process differs from the run's own time of it by more than `deviation`
        either way, with at least `MIN_SAMPLES` samples of the run: its figures may not hold for the run."""
        ratio = self.against_the_run
        return (ratio is not None and self.run_samples >= MIN_SAMPLES
                and deviation_outcome(ratio, ratio, self.deviation) == "deviates")

    @property
    def outcome(self) -> str:
        """What the interval says: "deviates" (wholly beyond `deviation` either way), "within" (wholly inside it),
        "undecided" (it reaches past the threshold: more rounds would decide), or "not judged".

        Example:
            >>> Triage(ratio=1.3, ratio_low=0.97, ratio_high=1.73).outcome, Triage(ratio=1.0, ratio_low=0.95,
            ...                                                                    ratio_high=1.05).outcome
            ('undecided', 'within')
        """
        if self.error is not None or self.ratio is None:
            return "not judged"
        if self.deviates:
            return "deviates"
        inside = deviation_outcome(self.ratio_low or 0, self.ratio_high or float("inf"), self.deviation) == "within"
        return "within" if inside else "undecided"

    @property
    def why(self) -> str | None:
        """"slower_than_inductor" or "faster_than_inductor" for a deviating piece, "triage_died" for a piece whose
        triage took its process down (its scripts' names say so)."""
        if self.died:
            return "triage_died"
        if not self.deviates or self.ratio is None:
            return None
        return "slower_than_inductor" if self.ratio > 1 else "faster_than_inductor"


@dataclasses.dataclass(frozen=True)
class Minimized(JsonRecord):
    """A piece the sentinel flagged, shrunk at flush (THUNDERFX_DEBUG_MINIMIZE=1) to the fewest ops that still fail
    the same way: `ops_before` -> `ops_after` (and its inputs and outputs), in `trials` runs of cuts of it (child
    processes) and `seconds`; `script` the minimal script's path in the dump. `verdict` is the full piece's RESULT
    line, `final` the minimal script's. Where nothing was written (`script` None), `note` says why (the piece did
    not fail outside the training process, failed at random, ...); `budget_spent` where its time ran out first."""

    ops_before: Count
    ops_after: Count | None = None
    inputs_before: Count = 0
    inputs_after: Count | None = None
    outputs_before: Count = 0
    outputs_after: Count | None = None
    trials: Count = 0
    seconds: float = 0.0
    script: str | None = None
    verdict: str = ""
    final: str = ""
    kept: tuple[str, ...] = ()
    budget_spent: bool = False
    note: str = ""
