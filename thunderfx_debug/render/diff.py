"""What changed between two runs (`thunderfx-debug diff A B`): graphs, splits and split reasons, fusion regions and
their ops, timing with the ratio B/A, flagging changes beyond noise (see `noise` for the test: every timed piece
of the two runs is judged at once, on its headline samples, relative to the run-wide shift), and what the pieces held
in memory (see `render.memory`: a figure changes where the two runs' ranges of it do not overlap).

Graphs are matched by name (graph0, graph1, ... in compile order), splits by name within a graph, fusion regions
by name and phase within a split: names are what a person greps for in both dumps.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from thunderfx_debug.records import RankRecord, SplitRecord, Timing
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import correctness, digest
from thunderfx_debug.render import memory as render_memory
from thunderfx_debug.render.headline import COLD_SAMPLES, MIN_SAMPLES
from thunderfx_debug.render.noise import ALPHA, MIN_EFFECT, NOISY_RESOLUTION, Change, ChangeOutcome, judge
from thunderfx_debug.render.text import ms, plural


@dataclasses.dataclass(frozen=True)
class FusionChange:
    """A fusion region added, removed or changed (`status`), with the ops it gained and lost (op -> count)."""

    split: str  # "graph0/thunder_0"
    name: str  # "nvFusion0"
    phase: str
    status: str  # "added" | "removed" | "changed"
    executor_a: str | None
    executor_b: str | None
    ops_added: dict[str, int]
    ops_removed: dict[str, int]


@dataclasses.dataclass(frozen=True)
class TimingChange:
    level: digest.PieceLevel
    path: str
    phase: str
    a: Timing | None
    b: Timing | None
    change: Change
    median_a: float | None = None  # headline medians (see `headline`)
    median_b: float | None = None


@dataclasses.dataclass(frozen=True)
class RunDiff:
    graphs_added: list[str]
    graphs_removed: list[str]
    compile_ids: list[tuple[str, str | None, str | None]]  # graphs whose compile id changed: (graph, a, b)
    splits_added: list[str]
    splits_removed: list[str]
    reasons: list[tuple[str, str, int, int]]  # (type, op, count in A, count in B) where the counts differ
    fusions: list[FusionChange]
    timings: list[TimingChange]  # every piece timed in A or B
    compiled_ms: tuple[float | None, float | None]  # the time in the compiled graphs per step, A and B
    shift: float | None = None  # the run-wide ratio B/A the pieces were judged against (see `noise`)
    # pieces (see `correctness.CheckedPiece.path`) that mismatch eager in B and did not in A, with B's verdict
    new_mismatches: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    memory: list[render_memory.MemoryChange] = dataclasses.field(default_factory=list)  # every figure either run measured
    same_dump: str | None = None  # where A and B are one dump (one process's, one flush's): which, in words

    @property
    def structure_changed(self) -> bool:
        return any((self.graphs_added, self.graphs_removed, self.splits_added, self.splits_removed, self.reasons,
                    self.fusions))

    @property
    def significant_timings(self) -> list[TimingChange]:
        return [t for t in self.timings if t.change.significant]


def diff_reports(a: RankRecord, b: RankRecord) -> RunDiff:
    """The differences from run `a` to run `b`."""
    graphs_a = {g.name: g for g in a.graphs}
    graphs_b = {g.name: g for g in b.graphs}
    common = [name for name in graphs_a if name in graphs_b]
    splits_added, splits_removed, fusions = [], [], []
    for name in common:
        splits_a = {s.name: s for s in graphs_a[name].splits}
        splits_b = {s.name: s for s in graphs_b[name].splits}
        splits_added += [PieceKey.of(name, s) for s in splits_b if s not in splits_a]
        splits_removed += [PieceKey.of(name, s) for s in splits_a if s not in splits_b]
        for split in splits_a.keys() & splits_b.keys():
            fusions += _fusion_changes(PieceKey.of(name, split), splits_a[split], splits_b[split])
    timings, shift = _timing_changes(a, b)
    reasons_a = Counter({(g.type, g.op): g.count for g in digest.group_reasons(a)})
    reasons_b = Counter({(g.type, g.op): g.count for g in digest.group_reasons(b)})
    reasons = [
        (t, op, reasons_a[(t, op)], reasons_b[(t, op)])
        for t, op in sorted(reasons_a.keys() | reasons_b.keys())
        if reasons_a[(t, op)] != reasons_b[(t, op)]
    ]
    return RunDiff(
        graphs_added=[n for n in graphs_b if n not in graphs_a],
        graphs_removed=[n for n in graphs_a if n not in graphs_b],
        compile_ids=[(n, graphs_a[n].compile_id, graphs_b[n].compile_id) for n in common
                     if graphs_a[n].compile_id != graphs_b[n].compile_id],
        splits_added=splits_added,
        splits_removed=splits_removed,
        reasons=reasons,
        fusions=sorted(fusions, key=lambda f: (f.split, f.phase, f.name)),
        timings=timings,
        compiled_ms=(digest.compiled_ms_per_step(a), digest.compiled_ms_per_step(b)),
        shift=shift,
        new_mismatches=_new_mismatches(a, b),
        memory=render_memory.memory_changes(a, b),
        same_dump=_same_dump(a, b),
    )


def _same_dump(a: RankRecord, b: RankRecord) -> str | None:
    """Which dump A and B both are, where they are one (the same process wrote both at the same flush: one directory
    given twice, or a copy of it); None otherwise."""
    keys = ("process_uid", "written_at", "rank")
    if any(a.meta.get(k) is None for k in keys) or any(a.meta.get(k) != b.meta.get(k) for k in keys):
        return None
    return f"run {a.meta.get('run_id') or '?'}, rank {a.rank}, written at {a.meta.get('written_at')}"


def _new_mismatches(a: RankRecord, b: RankRecord) -> list[tuple[str, str]]:
    """Pieces that mismatch eager in `b` but not in `a` (clean there, unchecked, or absent)."""
    before = {p.path for p in correctness.mismatching(a)}
    return [(p.path, correctness.mismatch_line(p)) for p in correctness.mismatching(b) if p.path not in before]


def _fusion_changes(where: str, a: SplitRecord, b: SplitRecord) -> list[FusionChange]:
    fusions_a = {(f.name, f.phase.value): f for f in a.fusions}
    fusions_b = {(f.name, f.phase.value): f for f in b.fusions}
    changes = []
    for key in sorted(fusions_a.keys() | fusions_b.keys()):
        fa, fb = fusions_a.get(key), fusions_b.get(key)
        ops_a, ops_b = Counter(fa.ops if fa else ()), Counter(fb.ops if fb else ())
        added, removed = dict(ops_b - ops_a), dict(ops_a - ops_b)
        status = "added" if fa is None else "removed" if fb is None else "changed"
        if status == "changed" and not added and not removed and fa.executor == fb.executor:
            continue
        changes.append(FusionChange(where, key[0], key[1], status, fa.executor if fa else None,
                                    fb.executor if fb else None, added, removed))
    return changes


def _timing_changes(a: RankRecord, b: RankRecord) -> tuple[list[TimingChange], float | None]:
    pieces_a = {(p.level, p.path, p.phase): p for p in digest.timed_pieces(a)}
    pieces_b = {(p.level, p.path, p.phase): p for p in digest.timed_pieces(b)}
    keys = list(pieces_a) + [k for k in pieces_b if k not in pieces_a]

    def samples(piece):
        return None if piece is None else piece.headline.samples_ms

    judged = judge([(samples(pieces_a.get(k)), samples(pieces_b.get(k))) for k in keys])
    changes = []
    for key, change in zip(keys, judged.changes):
        pa, pb = pieces_a.get(key), pieces_b.get(key)
        changes.append(TimingChange(*key, pa and pa.timing, pb and pb.timing, change, pa and pa.median_ms,
                                    pb and pb.median_ms))
    return changes, judged.shift


# ---- text ---------------------------------------------------------------------------------------------------------


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{op}" + (f" x{n}" if n > 1 else "") for op, n in sorted(ops.items()))


def render_structure_changes(d: RunDiff) -> list[str]:
    """Lines for what ThunderFX did differently (graphs, compile ids, splits, reasons, fusions); no timings."""
    lines = [f"graph added: {g}" for g in d.graphs_added] + [f"graph removed: {g}" for g in d.graphs_removed]
    lines += [f"compile id of {g}: {a} -> {b}" for g, a, b in d.compile_ids]
    lines += [f"split added: {s}" for s in d.splits_added] + [f"split removed: {s}" for s in d.splits_removed]
    lines += [f"split reason {t} {op}: {na} -> {nb}" for t, op, na, nb in d.reasons]
    for f in d.fusions:
        line = f"fusion {f.status}: {f.split}/{f.name} {f.phase}"
        if f.status == "changed":
            if f.executor_a != f.executor_b:
                line += f", executor {f.executor_a} -> {f.executor_b}"
            line += (f", ops gained: {_ops(f.ops_added)}" if f.ops_added else "")
            line += (f", ops lost: {_ops(f.ops_removed)}" if f.ops_removed else "")
        else:
            ops = f.ops_added or f.ops_removed
            line += f" ({f.executor_b or f.executor_a}, {plural(sum(ops.values()), 'op')})"
        lines.append(line)
    return lines or ["no change in graphs, splits, split reasons or fusions"]


def render_diff(d: RunDiff, label_a: str = "A", label_b: str = "B", show_all: bool = False) -> str:
    """The diff as text: structure first, then the timing changes beyond noise (all timed pieces if `show_all`)."""
    lines = [f"A = {label_a}", f"B = {label_b}"]
    if d.same_dump:
        lines.append(f"A and B are the same dump ({d.same_dump}): nothing below can differ; to compare two runs, "
                     "give the dumps of two runs (`thunderfx-debug runs DIR` lists the runs of a directory)")
    lines += ["", "structure:"]
    lines += ["  " + line for line in render_structure_changes(d)]
    if d.new_mismatches:
        lines += ["", f"correctness: {len(d.new_mismatches)} pieces mismatch eager in B and did not in A:"]
        lines += [f"  MISMATCH {line}" for _, line in d.new_mismatches]
    compiled_a, compiled_b = d.compiled_ms
    clocks = {t.clock for t in (*(c.a for c in d.timings), *(c.b for c in d.timings)) if t is not None}
    words = " and ".join(sorted(_clock_words(c) for c in clocks)) or "time"
    lines += ["", f"timing ({words}; headline medians in ms; ratio B/A above 1 means B is slower):"]
    verdicts = Counter(t.change.verdict for t in d.timings)
    judged = verdicts[ChangeOutcome.WITHIN_NOISE] + verdicts[ChangeOutcome.SLOWER] + verdicts[ChangeOutcome.FASTER]
    if compiled_a and compiled_b:
        line = (f"  time in the compiled graphs per step: {ms(compiled_a)} -> {ms(compiled_b)} ms, "
                f"{_ratio_words(compiled_b / compiled_a)}")
        if not judged and not _within(compiled_b / compiled_a, NOISY_RESOLUTION - 1):
            line += ("; no piece had the samples to tell whether this is the code or noise (each needs "
                     f"{MIN_SAMPLES} headline samples in both runs)")
        lines.append(line)
    big_shift = d.shift is not None and not _within(d.shift, NOISY_RESOLUTION - 1)
    if d.shift is not None and not _within(d.shift, 0.05):
        lines.append(f"  {'THE WHOLE RUN CHANGED: ' if big_shift else ''}across all pieces (the median of their "
                     f"ratios) B/A is {_ratio_words(d.shift)}: the machine (another device, its clocks, a busy "
                     "neighbour), or a change that touches everything (a setting, a version); each piece below is "
                     "judged against that shift")
    shown = d.timings if show_all else d.significant_timings
    if not d.timings:
        lines.append("  neither run has timing samples")
    elif not shown and judged:
        lines.append("  no piece changed beyond noise" + (" relative to that shift" if d.shift is not None else ""))
    elif not shown:
        lines.append("  no piece could be judged")
    for t in shown:
        lines.append("  " + _timing_line(t, d.shift))
    if not show_all:
        others = (ChangeOutcome.WITHIN_NOISE, ChangeOutcome.TOO_NOISY, ChangeOutcome.TOO_FEW,
                  ChangeOutcome.NOT_COMPARABLE)
        counted = [f"{verdicts[v]} {v.value}" for v in others if verdicts[v]]
        if counted:
            lines.append(f"  {'other ' if shown else ''}timed pieces: {', '.join(counted)} (--all lists them)")
    if verdicts[ChangeOutcome.TOO_FEW]:
        lines.append(f"  (too few samples: fewer than {MIN_SAMPLES} headline samples in a run; sample more often, "
                     "THUNDERFX_DEBUG_TIMING_EVERY, or train longer)")
    lines += [
        "",
        f"Beyond noise means: Yuen's test of 20%-trimmed means of log time, against changes of up to {MIN_EFFECT:.0%} "
        f"(smaller ones are not reported), Holm's correction over all {len(d.timings)} pieces (a false flag in the "
        f"whole diff has a chance below {ALPHA:.0%}), each piece relative to the run-wide shift. Samples: each "
        f"piece's first {COLD_SAMPLES} sampled call and its graph's disturbed calls are left out; fewer than "
        f"{MIN_SAMPLES} left is too few to judge, and a piece that could not show a {NOISY_RESOLUTION}x change beyond "
        "its noise is too noisy to judge.",
    ]
    lines += render_memory.diff_lines(d.memory, show_all)
    return "\n".join(lines) + "\n"


#: A resolution beyond this is said as "could not tell a 100x change" (a bigger figure reads as a measurement).
RESOLUTION_SHOWN = 100.0


def _clock_words(clock) -> str:
    return "host clock" if digest.time_word(clock) == "host" else f"{digest.time_word(clock)} time ({clock.value} clock)"


def _within(ratio: float, share: float) -> bool:
    return 1 / (1 + share) < ratio < 1 + share


def _ratio_words(ratio: float) -> str:
    """A ratio B/A with words that say the same: "ratio 1.120 (B 12% slower)", "ratio 0.009 (B 111x faster)".

    Example:
        >>> _ratio_words(4.075), _ratio_words(0.88), _ratio_words(1.02)
        ('ratio 4.075 (B 4.1x slower)', 'ratio 0.880 (B 12% faster)', 'ratio 1.020 (B 2% slower)')
    """
    if ratio >= 2:
        words = f"B {ratio:.1f}x slower"
    elif ratio <= 0.5:
        words = f"B {1 / ratio:.1f}x faster"
    elif ratio >= 1:
        words = f"B {ratio - 1:.0%} slower"
    else:
        words = f"B {1 - ratio:.0%} faster"
    return f"ratio {ratio:.3f} ({words})"


def _timing_line(t: TimingChange, shift: float | None = None) -> str:
    change = t.change
    a, b = ms(t.median_a), ms(t.median_b)
    ratio = "-" if change.ratio is None else f"{change.ratio:.3f}"
    verdict = change.verdict.value.upper()
    details = []
    if change.relative_ratio is not None and shift is not None and abs(change.relative_ratio - change.ratio) > 5e-4:
        # The verdict judges the piece against the run as a whole: say so where the raw ratio alone reads otherwise.
        if change.significant:
            verdict += " THAN THE RUN AS A WHOLE"
        details.append(f"{change.relative_ratio:.3f}x the run-wide shift of {shift:.3f}")
    if change.p_value is not None:
        details.append(f"p={change.p_value:.2g} before correction")
    if change.resolution is not None and change.verdict is not ChangeOutcome.WITHIN_NOISE:
        details.append(f"could tell {change.resolution:.2f}x" if change.resolution <= RESOLUTION_SHOWN
                       else f"could not tell a {RESOLUTION_SHOWN:.0f}x change from noise")
    label = f"{t.path} {t.phase}" + (" (outside fusions)" if t.level is digest.PieceLevel.OUTSIDE_FUSIONS else "")
    return f"{label}: {a} -> {b}  ratio {ratio}  {verdict}" + (f" ({', '.join(details)})" if details else "")
