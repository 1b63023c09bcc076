"""Where the pieces come from in the model's code (records' `sources` and backward pieces' `reads_saved_from`,
`GraphRecord.source_excerpts`), rendered: the regions that repeat the same source lines and ops grouped (a model's
layers: "the same lines in 24 regions"), each group counted once, for the summary and the HTML page; and, on the
page, the code around each line the regions name, with links to it. Records in, text out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from thunderfx_debug.records import READS_SAVED, RankRecord, SourceExcerpt, SourceLine, origin_lines, short_path
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest
from thunderfx_debug.render.svg import esc
from thunderfx_debug.render.text import ms, plural

#: Groups listed in the summary, the costliest (else the largest) first.
MAX_GROUPS = 10
#: Member regions named by path in a group's line; the rest are counted.
MAX_MEMBERS_NAMED = 6


@dataclasses.dataclass(frozen=True)
class RepeatedRegions:
    """Fusion regions of one executor and phase with the same ops and the same source lines (their own, and those
    that made the saved values they read): the same code fused alike in several places (the layers of a model, or
    one block's graph compiled again). `paths` name them ("graph0/thunder_2/TorchCompile8"); `ms_per_step` is their
    time per step together where each was timed, else None."""

    executor: str
    phase: str
    ops: tuple[str, ...]
    sources: tuple[str, ...]
    paths: tuple[str, ...]
    ms_per_step: float | None
    reads_saved_from: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.paths)

    def describe(self) -> str:
        """"the same lines and ops in 24 regions (forward, nvfuser, 12 ops), 1.234 ms per step together"."""
        time = f", {ms(self.ms_per_step, unit=True)} per step together" if self.ms_per_step is not None else ""
        return (f"the same lines and ops in {self.count} regions ({self.phase}, {self.executor}, "
                f"{plural(len(self.ops), 'op')}){time}")


def repeated_regions(report: RankRecord) -> list[RepeatedRegions]:
    """Every group of two or more regions with the same executor, phase, ops, sources and lines of saved values
    (regions that name no line are in none), the costliest first, then the largest."""
    timed = {(p.path, p.phase): p.ms_per_step for p in digest.timed_pieces(report)
             if p.level is digest.PieceLevel.FUSION}
    groups: dict[tuple, list[str]] = {}
    for graph in report.graphs:
        for split in graph.splits:
            for fusion in split.fusions:
                if fusion.sources or fusion.reads_saved_from:
                    key = (fusion.executor, fusion.phase.value, fusion.ops, fusion.sources, fusion.reads_saved_from)
                    groups.setdefault(key, []).append(f"{graph.name}/{split.name}/{fusion.name}")
    found = []
    for (executor, phase, ops, sources, saved), paths in groups.items():
        if len(paths) < 2:
            continue
        times = [timed.get((path, phase)) for path in paths]
        total = sum(times) if all(t is not None for t in times) else None
        found.append(RepeatedRegions(executor, phase, ops, sources, tuple(paths), total, saved))
    return sorted(found, key=lambda g: (g.ms_per_step is None, -(g.ms_per_step or 0.0), -g.count, g.paths[0]))


def group_of(report: RankRecord) -> dict[tuple[str, str], RepeatedRegions]:
    """(region path, phase) -> the group of alike regions it belongs to, for the regions that have one."""
    return {(path, group.phase): group for group in repeated_regions(report) for path in group.paths}


def _named(pieces: list[str]) -> str:
    rest = len(pieces) - MAX_MEMBERS_NAMED
    return ", ".join(pieces[:MAX_MEMBERS_NAMED]) + (f" and {rest} more" if rest > 0 else "")


def summary_lines(report: RankRecord) -> list[str]:
    """The summary's section on repeated regions (none where no region repeats another's lines and ops)."""
    groups = repeated_regions(report)
    if not groups:
        return []
    lines = ["", "regions that repeat the same source lines and ops (a model's layers), each group once:"]
    for group in groups[:MAX_GROUPS]:
        lines.append(f"  {group.describe()}: {_named(list(group.paths))}")
        lines += [f"    {text}" for text in origin_lines(group.sources, group.reads_saved_from)]
    if len(groups) > MAX_GROUPS:
        lines.append(f"  ... and {len(groups) - MAX_GROUPS} more groups (the HTML page lists them all)")
    return lines


class SourceIndex:
    """The source lines of a rank's pieces that have their code in the dump, each with an anchor on the HTML page
    ("rank0-src-3"), so that a piece's lines link to their code."""

    def __init__(self, report: RankRecord):
        self.rank = report.rank
        self.excerpts: dict[str, SourceExcerpt] = {}
        for graph in report.graphs:
            for text, excerpt in graph.source_excerpts.items():
                self.excerpts.setdefault(text, excerpt)
        named = sorted(self.excerpts, key=lambda text: _order(SourceLine.parse(text), text))
        self.anchors = {text: f"rank{self.rank}-src-{i}" for i, text in enumerate(named)}

    def links(self, sources: tuple[str, ...], limit: int = 3) -> str:
        """The first `limit` lines, short, each linked to its code where the dump has it (HTML)."""
        items = []
        for text in sources[:limit]:
            line = SourceLine.parse(text)
            label = esc(line.short if line is not None else text)
            anchor = self.anchors.get(text)
            items.append(f'<a href="#{anchor}">{label}</a>' if anchor else label)
        if len(sources) > limit:
            items.append(f"+{len(sources) - limit} more")
        return ", ".join(items)


def _order(line: SourceLine | None, text: str) -> tuple:
    return (line.file, line.line, line.function) if line is not None else (text, 0, "")


def _code_blocks(index: SourceIndex, named_by: Mapping[str, list[str]]) -> str:
    """The code around the pieces' lines, file by file, the excerpts of nearby lines merged into one block; each
    line a piece names highlighted, with its anchor and the pieces that name it."""
    code: dict[str, dict[int, str]] = {}  # file -> line number -> text
    marked: dict[str, dict[int, list[str]]] = {}  # file -> line number -> the source lines naming it
    for text, excerpt in index.excerpts.items():
        line = SourceLine.parse(text)
        if line is None:
            continue
        code.setdefault(line.file, {}).update(enumerate(excerpt.lines, excerpt.first_line))
        marked.setdefault(line.file, {}).setdefault(line.line, []).append(text)
    html = ""
    for file in sorted(code):
        numbers = sorted(code[file])
        runs = [[numbers[0]]]
        for number in numbers[1:]:
            if number == runs[-1][-1] + 1:
                runs[-1].append(number)
            else:
                runs.append([number])
        width = len(str(numbers[-1]))
        for run in runs:
            rows = []
            for number in run:
                row = f"{number:>{width}}  {esc(code[file][number])}"
                texts = marked[file].get(number)
                if texts:
                    ids = "".join(f'<span id="{index.anchors[t]}"></span>' for t in texts[1:])
                    pieces = [p for t in texts for p in named_by.get(t, [])]
                    row = (f'<span class="src" id="{index.anchors[texts[0]]}">{row}</span>{ids}'
                           f'<span class="muted">  # {esc(_named(pieces))}</span>')
                rows.append(row)
            html += (f"<p><b>{esc(short_path(file))}</b>, lines {run[0]} to {run[-1]} "
                     f'<span class="muted">({esc(file)})</span></p><pre>' + "\n".join(rows) + "</pre>")
    return html


def _named_by(report: RankRecord) -> Mapping[str, list[str]]:
    """Source line -> the pieces that name it (regions, op groups, splits), in report order; a backward piece that
    reads a value saved there says so."""
    found: dict[str, list[str]] = {}
    for graph in report.graphs:
        for split in graph.splits:
            path = PieceKey.of(graph.name, split.name)
            pieces = [(f"{path}/{f.name} {f.phase.value}", f) for f in split.fusions]
            pieces += [(f"{path} {g.label} {g.phase.value}", g) for g in split.op_groups]
            named = [(name, piece.sources) for name, piece in pieces]
            named += [(f"{name} (reads a value saved here)", piece.reads_saved_from) for name, piece in pieces]
            named += [(path, split.sources)]
            for piece, sources in named:
                for text in sources:
                    found.setdefault(text, []).append(piece)
    return found


def html_section(report: RankRecord, index: SourceIndex) -> str:
    """The page's section: the repeated regions, and the code around every line the pieces name (empty for a dump
    without sources)."""
    groups = repeated_regions(report)
    if not groups and not index.excerpts:
        return ""
    reads_saved = any(p.reads_saved_from for g in report.graphs for s in g.splits for p in (*s.fusions, *s.op_groups))
    html = ("<h3>Where the regions come from</h3><p>The lines of the model's code whose ops each piece holds (most "
            "ops first), read from Dynamo's record of each op and Thunder's of each fused op, with the code around "
            "them as it was at the flush."
            + (f" A backward piece also names, as &ldquo;{esc(READS_SAVED)}&rdquo;, the lines of the forward whose "
               "ops made the values saved for the backward that it reads (most reads first): not lines of its own "
               "ops." if reads_saved else "") + "</p>")
    if groups:
        saved = any(g.reads_saved_from for g in groups)  # a column only for dumps that record them

        def row(g: RepeatedRegions) -> str:
            return (f"<tr><td class=\"num\">{g.count}</td><td>{esc(g.phase)}</td><td>{esc(g.executor)}</td>"
                    f"<td class=\"num\">{len(g.ops)}</td><td class=\"num\">{ms(g.ms_per_step)}</td>"
                    f"<td>{index.links(g.sources)}</td>"
                    + (f"<td>{index.links(g.reads_saved_from)}</td>" if saved else "")
                    + f"<td>{esc(_named(list(g.paths)))}</td></tr>")

        html += ("<h4>Regions that repeat the same lines and ops</h4><table><tr><th>regions</th><th>phase</th>"
                 "<th>executor</th><th>ops</th><th>ms per step together</th><th>from</th>"
                 + (f"<th>{esc(READS_SAVED)}</th>" if saved else "") + "<th>which</th></tr>"
                 + "".join(row(g) for g in groups) + "</table>")
    if index.excerpts:
        html += "<h4>The code</h4>" + _code_blocks(index, _named_by(report))
    return html
