"""What the pieces held in memory (records' `memory`, the step's in the manifest, the triage's Thunder-against-
inductor figures) rendered: the summary's section, the HTML page's, triage.md's and the diff's.

Saved bytes are what a piece's forward saved for its backward (distinct storages, parameters left out); peaks are
the most the CUDA allocator held during a phase above what it held when the phase started (not measured on CPU).
The figures are the largest over the measured calls (`records.Memory`)."""

from __future__ import annotations

import dataclasses
import html as _html

from thunderfx_debug.records import Memory, RankRecord, SplitKind
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest
from thunderfx_debug.render.text import plural

#: Pieces listed per ranking in the summary (the HTML page lists every measured split).
SUMMARY_TOP = 5
#: A figure changes between runs when the two runs' ranges of it do not overlap and it moves by more than this.
MIN_CHANGE = 0.02


def size(nbytes: int | None, signed: bool = False) -> str:
    """Bytes in binary units ("-" for none), with a sign where `signed`.

    Example:
        >>> size(512), size(65928), size(3 << 30), size(-2048, signed=True), size(None)
        ('512 B', '64.4 KiB', '3.00 GiB', '-2.0 KiB', '-')
    """
    if nbytes is None:
        return "-"
    sign = "-" if nbytes < 0 else "+" if signed else ""
    value = abs(nbytes)
    if value < 1024:
        return f"{sign}{value} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if value < scale * 1024 or unit == "GiB":
            shown = value / scale
            return f"{sign}{shown:.2f} {unit}" if unit == "GiB" else f"{sign}{shown:.1f} {unit}"
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class MemoryPiece:
    """A graph or split with its memory: `path` "graph0" or "graph0/thunder_2", `kind` thunder, inductor or graph."""

    path: str
    level: str  # "graph" or "split"
    kind: str
    memory: Memory
    calls_per_step: float = 1.0


def memory_pieces(report: RankRecord) -> list[MemoryPiece]:
    """Every graph and split with a memory record, in report order."""
    steps = digest.steps(report)
    pieces = []
    for graph in report.graphs:
        per_step = steps.per_step(graph)
        if graph.memory is not None:
            pieces.append(MemoryPiece(graph.name, "graph", "graph", graph.memory, per_step))
        for split in graph.splits:
            if split.memory is not None:
                pieces.append(MemoryPiece(PieceKey.of(graph.name, split.name), "split", split.kind.value, split.memory,
                                          per_step))
    return pieces


def top_splits(report: RankRecord, by: str, limit: int | None = SUMMARY_TOP) -> list[MemoryPiece]:
    """The splits holding the most by `by` ("saved_bytes" or "peak_bytes"), those without the figure left out."""
    splits = [p for p in memory_pieces(report) if p.level == "split" and getattr(p.memory, by)]
    splits.sort(key=lambda p: (-getattr(p.memory, by), p.path))
    return splits if limit is None else splits[:limit]


@dataclasses.dataclass(frozen=True)
class MemoryGap:
    """A triaged split's memory under ThunderFX against inductor's counterpart, both measured on one call in the
    triage's process on the same inputs."""

    path: str
    thunder: Memory
    inductor: Memory

    @property
    def saved_gap(self) -> int | None:
        return _gap(self.thunder.saved_bytes, self.inductor.saved_bytes)

    @property
    def peak_gap(self) -> int | None:
        return _gap(self.thunder.peak_bytes, self.inductor.peak_bytes)

    @property
    def holds_more(self) -> bool:
        """ThunderFX holds more than inductor: more saved for the backward, or a higher peak."""
        return any(g is not None and g > 0 for g in (self.saved_gap, self.peak_gap))


def _gap(thunder: int | None, inductor: int | None) -> int | None:
    return None if thunder is None or inductor is None else thunder - inductor


def triage_gaps(report: RankRecord) -> list[MemoryGap]:
    """Every triaged split with both sides' memory, the largest gap (saved bytes, then peak) first."""
    gaps = []
    for graph in report.graphs:
        for split in graph.splits:
            triage = split.triage
            if split.kind is SplitKind.THUNDER and triage is not None and triage.thunder_memory is not None \
                    and triage.inductor_memory is not None:
                gaps.append(MemoryGap(PieceKey.of(graph.name, split.name), triage.thunder_memory, triage.inductor_memory))
    return sorted(gaps, key=lambda g: (-(g.saved_gap or 0), -(g.peak_gap or 0), g.path))


def _ratio(thunder: int | None, inductor: int | None) -> str:
    if thunder is None or inductor is None:
        return ""
    if inductor == 0:
        return "" if thunder == 0 else ", inductor none"
    return f", {thunder / inductor:.2f}x"


def gap_line(gap: MemoryGap) -> str:
    """"graph0/thunder_2: saved 64.4 KiB against inductor's 50.0 KiB (+14.4 KiB, 1.29x); peak ..."."""
    t, i = gap.thunder, gap.inductor
    line = (f"{gap.path}: saved {size(t.saved_bytes)} against inductor's {size(i.saved_bytes)} "
            f"({size(gap.saved_gap, signed=True)}{_ratio(t.saved_bytes, i.saved_bytes)})")
    if t.peak_bytes is not None or i.peak_bytes is not None:
        line += (f"; peak {size(t.peak_bytes)} against {size(i.peak_bytes)} "
                 f"({size(gap.peak_gap, signed=True)}{_ratio(t.peak_bytes, i.peak_bytes)})")
    notes = [f"{side}: {m.note}" for side, m in (("ThunderFX", t), ("inductor", i)) if m.note]
    return line + (f" [{'; '.join(notes)}]" if notes else "")


def _peaks(memory: Memory) -> str:
    if memory.peak_bytes is None:
        return ""
    return f", peak {size(memory.peak_forward_bytes)} forward / {size(memory.peak_backward_bytes)} backward"


def step_line(report: RankRecord) -> str | None:
    step = report.step_memory
    if step is None:
        return None
    line = (f"step: saved {size(step.saved_bytes)} for the backward (every graph of a sampled step, distinct "
            "storages)")
    if step.peak_bytes is not None:
        line += (f", peak {size(step.peak_bytes)} above what was allocated when the step's first piece started "
                 f"(the most over {plural(step.peak_calls, 'sampled step')})")
    else:
        line += ", peak not measured (" + (step.note or "on CPU the allocator keeps no history") + ")"
    return line


def summary_lines(report: RankRecord) -> list[str]:
    """The summary's memory section (empty where nothing was measured)."""
    pieces = memory_pieces(report)
    gaps = triage_gaps(report)
    if not pieces and not gaps:
        return []
    lines = ["", "memory (on sampled calls; saved: distinct storages autograd saved for the backward, parameters left "
                 "out; peak: the most the CUDA allocator held during a phase above what it held at its start; the "
                 "largest over the measured calls):"]
    step = step_line(report)
    if step:
        lines.append("  " + step)
    for by, words in (("saved_bytes", "saved for the backward"), ("peak_bytes", "peak")):
        top = top_splits(report, by)
        if top:
            lines.append(f"  top splits by {words}:")
            lines += [f"    {i}. {p.path} ({p.kind}): saved {size(p.memory.saved_bytes)}{_peaks(p.memory)}"
                      for i, p in enumerate(top, 1)]
    if gaps:
        lines += ["  " + line for line in gap_summary(gaps)]
    return lines


def gap_summary(gaps: list[MemoryGap]) -> list[str]:
    """Which triaged splits hold more under ThunderFX than under inductor, and how much."""
    more = [g for g in gaps if g.holds_more]
    saved = sum(g.saved_gap for g in gaps if g.saved_gap is not None)
    lines = [f"ThunderFX against inductor (the triage: one call of each in a process of its own, same inputs): "
             f"{len(more)} of {plural(len(gaps), 'split')} hold more under ThunderFX; saved bytes "
             f"{size(saved, signed=True)} in all"]
    lines += [f"  {'more' if g.holds_more else 'not more'}: {gap_line(g)}" for g in gaps[:SUMMARY_TOP]]
    if len(gaps) > SUMMARY_TOP:
        lines.append(f"  ... and {len(gaps) - SUMMARY_TOP} more (triage.md)")
    return lines


def triage_md_lines(report: RankRecord) -> list[str]:
    """triage.md's memory section (empty where the triage measured none)."""
    gaps = triage_gaps(report)
    if not gaps:
        return []
    lines = ["", "## Memory: ThunderFX against inductor", "",
             "Each split and inductor's compile of it called once in the triage's process on the same inputs: what "
             "its forward saved for the backward (distinct storages, parameters left out) and, on CUDA, the peaks "
             "of its forward and backward above what was allocated before each.", "",
             "| split | ThunderFX saved | inductor saved | difference | ThunderFX peak | inductor peak | difference "
             "| holds more under ThunderFX |", "|---|---|---|---|---|---|---|---|"]
    for g in gaps:
        t, i = g.thunder, g.inductor
        lines.append(f"| {g.path} | {size(t.saved_bytes)} | {size(i.saved_bytes)} | {size(g.saved_gap, True)} | "
                     f"{size(t.peak_bytes)} | {size(i.peak_bytes)} | {size(g.peak_gap, True)} | "
                     f"{'yes' if g.holds_more else 'no'} |")
    notes = [f"- {g.path}, {side}: {m.note}" for g in gaps for side, m in (("ThunderFX", g.thunder),
                                                                             ("inductor", g.inductor)) if m.note]
    return lines + (["", *notes] if notes else [])


def html_section(report: RankRecord) -> str:
    """The HTML page's memory section (empty where nothing was measured)."""
    pieces = memory_pieces(report)
    gaps = triage_gaps(report)
    if not pieces and not gaps:
        return ""
    esc = _html.escape
    html = ("<h3>Memory</h3><p>On sampled calls: what each piece's forward saved for its backward (distinct "
            "storages, parameters left out) and, on CUDA, the most the allocator held during its forward and its "
            "backward above what it held at their start; the largest over the measured calls.</p>")
    step = step_line(report)
    if step:
        html += f"<p>{esc(step[0].upper() + step[1:])}</p>"
    splits = sorted((p for p in pieces if p.level == "split"),
                    key=lambda p: (-(p.memory.saved_bytes or 0), -(p.memory.peak_bytes or 0), p.path))
    if splits:
        rows = "".join(
            f"<tr><td>{esc(p.path)}</td><td>{esc(p.kind)}</td><td class=\"num\">{size(p.memory.saved_bytes)}</td>"
            f"<td class=\"num\">{size(p.memory.peak_forward_bytes)}</td>"
            f"<td class=\"num\">{size(p.memory.peak_backward_bytes)}</td><td class=\"num\">{p.memory.calls}</td></tr>"
            for p in splits)
        html += ("<table><tr><th>split</th><th>kind</th><th>saved for backward</th><th>forward peak</th>"
                 f"<th>backward peak</th><th>calls measured</th></tr>{rows}</table>")
    if gaps:
        rows = "".join(
            f"<tr><td>{esc(g.path)}</td><td class=\"num\">{size(g.thunder.saved_bytes)}</td>"
            f"<td class=\"num\">{size(g.inductor.saved_bytes)}</td><td class=\"num\">{size(g.saved_gap, True)}</td>"
            f"<td class=\"num\">{size(g.thunder.peak_bytes)}</td><td class=\"num\">{size(g.inductor.peak_bytes)}</td>"
            f"<td class=\"num\">{size(g.peak_gap, True)}</td><td>{'yes' if g.holds_more else 'no'}</td></tr>"
            for g in gaps)
        html += ("<h4>ThunderFX against inductor</h4><p>The triage's figures: each split and inductor's compile of "
                 "it, one call each in a process of its own, on the same inputs.</p><table><tr><th>split</th>"
                 "<th>ThunderFX saved</th><th>inductor saved</th><th>difference</th><th>ThunderFX peak</th>"
                 f"<th>inductor peak</th><th>difference</th><th>holds more under ThunderFX</th></tr>{rows}</table>")
    return html


# ---- the diff -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MemoryChange:
    """One figure of one piece in two runs: `a` and `b` its (smallest, largest) over each run's measured calls."""

    path: str  # "graph0/thunder_2", "graph0", or "step"
    figure: str  # "saved" or "peak"
    a: tuple[int, int] | None
    b: tuple[int, int] | None

    @property
    def verdict(self) -> str:
        """"more", "less", "same" (the ranges overlap, or it moved by less than MIN_CHANGE), or "not comparable".

        Example:
            >>> MemoryChange("graph0", "saved", (100, 100), (120, 120)).verdict, MemoryChange(
            ...     "graph0", "saved", (100, 110), (105, 120)).verdict
            ('more', 'same')
        """
        if self.a is None or self.b is None:
            return "not comparable"
        (a_low, a_high), (b_low, b_high) = self.a, self.b
        if b_low > a_high and b_low - a_high > MIN_CHANGE * max(a_high, 1):
            return "more"
        if b_high < a_low and a_low - b_high > MIN_CHANGE * max(a_low, 1):
            return "less"
        return "same"


def _ranges(memory: Memory | None) -> dict[str, tuple[int, int]]:
    if memory is None:
        return {}
    ranges = {}
    if memory.saved_bytes is not None:
        low = memory.saved_least_bytes if memory.saved_least_bytes is not None else memory.saved_bytes
        ranges["saved"] = (low, memory.saved_bytes)
    if memory.peak_bytes is not None:
        low = memory.peak_least_bytes if memory.peak_least_bytes is not None else memory.peak_bytes
        ranges["peak"] = (low, memory.peak_bytes)
    return ranges


def _memories(report: RankRecord) -> dict[str, Memory]:
    found = {p.path: p.memory for p in memory_pieces(report)}
    if report.step_memory is not None:
        found["step"] = report.step_memory
    return found


def memory_changes(a: RankRecord, b: RankRecord) -> list[MemoryChange]:
    """Every figure measured in either run, for the step, graphs and splits matched by name."""
    memories_a, memories_b = _memories(a), _memories(b)
    changes = []
    for path in list(memories_a) + [p for p in memories_b if p not in memories_a]:
        ranges_a, ranges_b = _ranges(memories_a.get(path)), _ranges(memories_b.get(path))
        for figure in ("saved", "peak"):
            if figure in ranges_a or figure in ranges_b:
                changes.append(MemoryChange(path, figure, ranges_a.get(figure), ranges_b.get(figure)))
    return changes


def diff_lines(changes: list[MemoryChange], show_all: bool = False) -> list[str]:
    """The diff's memory section: the figures that changed (all with `show_all`), then a count of the others."""
    if not changes:
        return ["", "memory: neither run measured any"]
    lines = ["", f"memory (the largest over each run's measured calls; a figure changed where the runs' ranges do not "
                 f"overlap and it moved by more than {MIN_CHANGE:.0%}):"]
    shown = [c for c in changes if show_all or c.verdict in ("more", "less")]
    for c in shown:
        a = size(c.a[1]) if c.a else "-"
        b = size(c.b[1]) if c.b else "-"
        moved = f" ({size(c.b[1] - c.a[1], signed=True)})" if c.a and c.b else ""
        lines.append(f"  {c.path} {c.figure}: {a} -> {b}{moved}  {c.verdict.upper()}")
    rest = len(changes) - len(shown)
    if rest:
        lines.append(f"  {'other ' if shown else ''}figures: {rest} the same or not comparable (--all lists them)")
    return lines
