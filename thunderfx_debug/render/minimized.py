"""The pieces minimized at flush (THUNDERFX_DEBUG_MINIMIZE=1, records' `minimized`): the summary's lines and the
HTML section, each piece as `minimized <piece>: <n> ops -> <m> ops` with its minimal script, or why it was not.
Records in, text out.

Example:
    >>> from thunderfx_debug.records import Minimized
    >>> line(MinimizedPiece("graph0/thunder_2", Minimized(31, 1, trials=12, seconds=10.8, script="g/x.py")))
    'minimized graph0/thunder_2: 31 ops -> 1 ops (12 trials, 10.8 s)'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from thunderfx_debug.records import Minimized, RankRecord
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render.svg import esc


@dataclasses.dataclass(frozen=True)
class MinimizedPiece:
    path: str  # "graph0/thunder_2" or "graph0/thunder_2/nvFusion0_forward"
    minimized: Minimized


def minimized_pieces(report: RankRecord) -> list[MinimizedPiece]:
    """Every piece with a `minimized` record, splits before their regions, in report order."""
    pieces = []
    for graph in report.graphs:
        for split in graph.splits:
            path = PieceKey.of(graph.name, split.name)
            if split.minimized is not None:
                pieces.append(MinimizedPiece(path, split.minimized))
            pieces += [MinimizedPiece(f"{path}/{f.qualified_name}", f.minimized) for f in split.fusions
                       if f.minimized is not None]
    return pieces


def line(piece: MinimizedPiece) -> str:
    m = piece.minimized
    if m.script is None:
        return f"not minimized {piece.path}: {m.note}"
    budget = ", stopped by its budget" if m.budget_spent else ""
    return (f"minimized {piece.path}: {m.ops_before} ops -> {m.ops_after} ops ({m.trials} trials, {m.seconds:g} s"
            f"{budget})")


def summary_lines(report: RankRecord) -> list[str]:
    """The summary's section (none for a run that minimized nothing)."""
    pieces = minimized_pieces(report)
    if not pieces:
        return []
    lines = ["", "minimized (the flagged pieces shrunk to the fewest ops that still fail the same way):"]
    for piece in pieces:
        lines.append(f"  {line(piece)}")
        m = piece.minimized
        if m.script is not None:
            lines.append(f"    kept: {'; '.join(m.kept)[:300]}")
            lines.append(f"    script: {m.script}")
            if m.note:
                lines.append(f"    note: {m.note}")
    return lines


def html_section(report: RankRecord, link: Callable[[str], str]) -> str:
    """The HTML section; `link(path)` makes the link to a script in the dump (HTML)."""
    pieces = minimized_pieces(report)
    if not pieces:
        return ""
    items = []
    for piece in pieces:
        m = piece.minimized
        text = f"<li>{esc(line(piece))}"
        if m.script is not None:
            text += f"<br>kept: <code>{esc('; '.join(m.kept)[:300])}</code><br>script: {link(m.script)}"
            if m.note:
                text += f"<br>note: {esc(m.note)}"
        items.append(text + "</li>")
    return ("<h3>Minimized</h3><p>The pieces the correctness sentinel flagged, shrunk at flush to the fewest ops "
            "that still fail the same way (THUNDERFX_DEBUG_MINIMIZE):</p><ul>" + "".join(items) + "</ul>")
