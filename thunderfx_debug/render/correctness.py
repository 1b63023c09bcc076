"""The correctness section of the summary and the HTML page (THUNDERFX_DEBUG_CHECK): which Thunder pieces were
checked against eager, which mismatched (the piece, the call, the worst error against its tolerance), which could
not be compared and why. Records in, text out.
"""

from __future__ import annotations

import dataclasses

from thunderfx_debug.records import Check, RankRecord

#: Pieces listed by name in the text summary's section; the rest are counted.
MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class CheckedPiece:
    """A checked piece: `path` is "graph0/thunder_0" (a split) or "graph0/thunder_0/nvFusion0_forward" (a
    fusion region); `files` its record's files (the mismatch script among them)."""

    path: str
    level: str  # "split" | "fusion"
    check: Check
    files: dict[str, str]


def checked_pieces(report: RankRecord) -> list[CheckedPiece]:
    """Every piece with a check record, splits before their regions, in report order."""
    pieces = []
    for graph in report.graphs:
        for split in graph.splits:
            path = f"{graph.name}/{split.name}"
            if split.check is not None:
                pieces.append(CheckedPiece(path, "split", split.check, dict(split.files)))
            for fusion in split.fusions:
                if fusion.check is not None:
                    pieces.append(CheckedPiece(f"{path}/{fusion.qualified_name}", "fusion", fusion.check,
                                               dict(fusion.files)))
    return pieces


def mismatching(report: RankRecord) -> list[CheckedPiece]:
    return [p for p in checked_pieces(report) if p.check.mismatched]


def mismatch_line(piece: CheckedPiece) -> str:
    """"graph0/thunder_2: forward output 0 at call 1, error 16 (relative 235) against 0.000108 allowed (float64
    eager), 1.5e+05 x the tolerance; 2 of 2 checked calls mismatched (first at call 1)"."""
    c = piece.check
    line = (f"{piece.path}: {c.worst_output} at call {c.worst_call}, error {_g(c.worst_abs_error)} (relative "
            f"{_g(c.worst_rel_error)}) against {_g(c.allowed)} allowed ({c.reference}), {_g(c.worst_ratio)} x the "
            f"tolerance; {c.mismatches} of {c.calls} checked calls mismatched (first at call {c.first_mismatch_call})")
    others = [label for label in c.mismatched_values if label != c.worst_output]
    if others:
        line += f"; also beyond tolerance: {'; '.join(others)}"
    return line


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def render_correctness(report: RankRecord) -> list[str]:
    """The summary's section; no lines for a run that checked nothing."""
    pieces = checked_pieces(report)
    if not pieces:
        return []
    bad = [p for p in pieces if p.check.mismatched]
    uncompared = [p for p in pieces if not p.check.mismatched and p.check.compared == 0]
    clean = [p for p in pieces if not p.check.mismatched and p.check.compared]
    lines = [f"correctness (Thunder against eager on checked calls): {len(bad)} of {len(pieces)} checked pieces "
             "MISMATCH" if bad else
             f"correctness (Thunder against eager on checked calls): no mismatch in {len(pieces)} checked pieces"]
    for piece in bad[:MAX_LISTED]:
        lines.append(f"  MISMATCH {mismatch_line(piece)}")
        script = next((path for label, path in piece.files.items() if "mismatch" in label), None)
        if script:
            lines.append(f"    script: {script}")
    if len(bad) > MAX_LISTED:
        lines.append(f"  ... and {len(bad) - MAX_LISTED} more mismatching pieces")
    if clean:
        splits = sum(p.level == "split" for p in clean)
        lines.append(f"  checked clean: {splits} splits, {len(clean) - splits} fusion regions")
    for piece in uncompared[:MAX_LISTED]:
        reason = "; ".join(piece.check.skipped) or "nothing to compare"
        lines.append(f"  not compared: {piece.path}: {reason}")
    partly = [p for p in clean if p.check.skipped]
    for piece in partly[:MAX_LISTED]:
        lines.append(f"  partly compared: {piece.path}: {'; '.join(piece.check.skipped)}")
    return lines
