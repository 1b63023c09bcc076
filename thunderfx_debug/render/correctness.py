"""The correctness section of the summary and the HTML page (THUNDERFX_DEBUG_CHECK): every Thunder piece the check
covers (each Thunder split, and at `fusion` each fusion region), which mismatched (the piece, the call, the worst
error against its tolerance), which were checked clean (every value compared), which were compared only partly (no
mismatch in what was compared, but some values were not: dropout's outputs, say) and which could not be compared at
all, and why (a check that failed, values drawn at random, a region other than the one of the trace, a backward that
never ran, ...). A piece whose check failed, or whose values were not all compared, is never counted clean; a region
seen writing memory it does not own is named so. Records in, text out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from thunderfx_debug.records import Check, RankRecord, SplitKind, origin_lines
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render.text import plural

#: Pieces listed by name in the text summary's section; the rest are counted.
MAX_LISTED = 20

#: Short names of why values were not compared, for the headline, by a phrase of the recorded reason.
_WHY = (
    ("raised", "the check failed"),
    ("random", "random numbers"),
    ("not the one of the trace", "a region other than the one of the trace"),
    ("never ran", "a backward that never ran"),
    ("cannot be verified", "a gradient whose capture could not be verified"),
    ("wrote into inputs", "inputs written in place"),
    ("changed in place", "inputs written in place"),
    ("no checked call", "never run on a checked call"),
    ("out of device memory", "no device memory for the check"),
)


#: The repro script that runs a fusion region as the run did, by the region's executor.
_RUN_AS = {"nvfuser": "repro_nvfuser", "torchcompile": "repro_inductor"}


@dataclasses.dataclass(frozen=True)
class CheckedPiece:
    """A piece the check covers: `path` is "graph0/thunder_0" (a split) or "graph0/thunder_0/nvFusion0_forward" (a
    fusion region); `check` its record (None: no checked call ran it); `files` its record's files (the mismatch
    script among them); `sources` the lines of the model's code its ops came from, `reads_saved_from` those of the
    forward that made the saved values it reads (a backward region)."""

    path: str
    level: str  # "split" | "fusion"
    check: Check | None
    files: dict[str, str]
    sources: tuple[str, ...] = ()
    executor: str = ""  # a fusion region's ("nvfuser", "torchcompile"); "" for a split
    reads_saved_from: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """"mismatch", "failed" (the check itself failed), "clean" (every value compared, none mismatched), "partly
        compared" (none mismatched, some values not compared), or "not compared"."""
        c = self.check
        if c is None:
            return "not compared"
        if c.mismatched:
            return "mismatch"
        if c.failures:
            return "failed"
        if not c.compared:
            return "not compared"
        return "partly compared" if c.partly_compared else "clean"

    @property
    def scripts(self) -> dict[str, str]:
        """label -> path of the scripts that run this piece as the check did: its mismatch scripts where it
        mismatched, else the repro script that runs it as the run did (a split under Thunder, a region under its
        executor; a TorchCompile region is inductor's code); none where the dump has none."""
        mismatch = {label: path for label, path in self.files.items() if label.startswith("repro_mismatch_")}
        if mismatch:
            return mismatch
        label = "repro_thunder" if self.level == "split" else _RUN_AS.get(self.executor.lower())
        return {label: self.files[label]} if label in self.files else {}

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why values of this piece were not compared (or its check failed)."""
        if self.check is None:
            return ("no checked call ran it",)
        return (*self.check.failed, *self.check.skipped) or (() if self.check.compared else ("nothing to compare",))


def check_level(report: RankRecord) -> str:
    """"off", "split" or "fusion": the run's THUNDERFX_DEBUG_CHECK (from the manifest; for a dump without it, what
    its records show)."""
    config = report.meta.get("config")
    level = config.get("check") if isinstance(config, dict) else None
    if level in ("split", "fusion"):
        return level
    splits = [s for g in report.graphs for s in g.splits]
    if any(f.check is not None for s in splits for f in s.fusions):
        return "fusion"
    return "split" if any(s.check is not None for s in splits) else "off"


def checked_pieces(report: RankRecord) -> list[CheckedPiece]:
    """Every piece the run's check level covers, splits before their regions, in report order; none where the check
    was off."""
    level = check_level(report)
    if level == "off":
        return []
    pieces = []
    for graph in report.graphs:
        for split in graph.splits:
            path = PieceKey.of(graph.name, split.name)
            if split.kind is SplitKind.THUNDER or split.check is not None:
                pieces.append(CheckedPiece(path, "split", split.check, dict(split.files), split.sources))
            for fusion in split.fusions:
                if level == "fusion" or fusion.check is not None:
                    pieces.append(CheckedPiece(f"{path}/{fusion.qualified_name}", "fusion", fusion.check,
                                               dict(fusion.files), fusion.sources, fusion.executor,
                                               fusion.reads_saved_from))
    return pieces


def mismatching(report: RankRecord) -> list[CheckedPiece]:
    return [p for p in checked_pieces(report) if p.status == "mismatch"]


def mismatch_line(piece: CheckedPiece) -> str:
    """"graph0/thunder_2: forward output 0 at call 1, error 16 (relative 235) against 0.000108 allowed (float64
    eager), 1.5e+05 x the tolerance; 2 of 2 checked calls mismatched (first at call 1)"."""
    c = piece.check
    unowned = "writes memory it does not own: " if c.writes_unowned_memory else ""
    line = (f"{piece.path}: {unowned}{c.worst_output} at call {c.worst_call}, error {_g(c.worst_abs_error)} (relative "
            f"{_g(c.worst_rel_error)}) against {_g(c.allowed)} allowed ({c.reference}), {_g(c.worst_ratio)} x the "
            f"tolerance; {c.mismatches} of {c.calls} checked calls mismatched (first at call {c.first_mismatch_call})")
    others = [label for label in c.mismatched_values if label != c.worst_output]
    if others:
        line += f"; also beyond tolerance: {'; '.join(others)}"
    return line


def describe_check(check: Check) -> str:
    """One line on what the check of a piece found: "3 checked calls, 1 mismatch (first at call 51); worst: forward
    output 2 at call 51, error 0.31 (relative 0.05) against 0.0125 allowed (rtol 0.05, atol 0.05, against float64
    eager): 24.8 of the tolerance"."""
    line = f"{check.calls} checked call{'s' if check.calls != 1 else ''}"
    if check.passed_over:
        line += (f" ({check.passed_over} more scheduled, passed over to keep the checks within "
                 "THUNDERFX_DEBUG_CHECK_SHARE of the training's time)")
    if check.mismatches:
        line += (f", {check.mismatches} mismatch{'es' if check.mismatches != 1 else ''}"
                 f" (first at call {check.first_mismatch_call})")
    else:
        line += ", no mismatch" if check.compared else ", nothing compared"
    if check.worst_output is not None:
        line += (f"; worst: {check.worst_output} at call {check.worst_call}, error {_g(check.worst_abs_error)} "
                 f"(relative {_g(check.worst_rel_error)}) against {_g(check.allowed)} allowed "
                 f"(rtol {_g(check.rtol)}, atol {_g(check.atol)}, against {check.reference}): "
                 f"{_g(check.worst_ratio)} of the tolerance")
    if check.skipped:
        line += "; not compared: " + "; ".join(check.skipped)
    if check.failures:
        line += (f"; the check failed on {check.failures} call{'s' if check.failures != 1 else ''}: "
                 + "; ".join(check.failed))
    return line


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def why(reason: str) -> str:
    """The short name of a reason for the headline."""
    return next((short for phrase, short in _WHY if phrase in reason), "other reasons")


def verdict(pieces: list[CheckedPiece]) -> str:
    """What the headline says, in one word, for whoever colours it: "mismatch" (a piece mismatched, or writes memory
    it does not own), "uncompared" (none did, but some pieces were not compared, or only partly, or their check
    failed), "clean" (every value of every piece was compared and none mismatched)."""
    if any(p.status == "mismatch" or (p.check is not None and p.check.writes_unowned_memory) for p in pieces):
        return "mismatch"
    uncompared = ("failed", "not compared", "partly compared")
    return "uncompared" if any(p.status in uncompared for p in pieces) else "clean"


def note(piece: CheckedPiece) -> str:
    """What a table row of the piece cannot hold, in one line ("" for a piece compared whole and clean): why its
    values were not compared or its check failed, which values were left out of a partly compared piece, which
    others besides the worst were beyond tolerance."""
    c = piece.check
    if piece.status == "not compared":
        return "not compared: " + "; ".join(piece.reasons)
    parts = []
    if c.failures:
        parts.append(f"the check failed on {c.failures} call{'s' if c.failures != 1 else ''}: " + "; ".join(c.failed))
    if c.mismatches:
        others = [label for label in c.mismatched_values if label != c.worst_output]
        parts.append(f"{c.mismatches} of {c.calls} checked calls mismatched (first at call {c.first_mismatch_call})"
                     + (f"; also beyond tolerance: {'; '.join(others)}" if others else ""))
    if c.skipped:
        parts.append(("partly compared: " if c.compared else "not compared: ") + "; ".join(c.skipped))
    return "; ".join(parts)


def headline(pieces: list[CheckedPiece]) -> str:
    """The section's first line: mismatches, what was compared clean, and how many pieces could not be compared,
    by why."""
    by_status = Counter(p.status for p in pieces)
    bad, clean, partly = by_status["mismatch"], by_status["clean"], by_status["partly compared"]
    uncompared = [p for p in pieces if p.status in ("failed", "not compared")]
    text = "correctness (Thunder against eager on checked calls): "
    if bad:
        text += f"{bad} of {len(pieces)} pieces MISMATCH"
    else:
        text += f"no mismatch in {plural(clean + partly, 'compared piece')}"
        text += f", {partly} of them only partly compared" if partly else ""
    if uncompared:
        kinds = Counter(why(p.reasons[0]) if p.status == "not compared" else "the check failed" for p in uncompared)
        text += (f"; {len(uncompared)} of {len(pieces)} pieces not compared ("
                 + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()) + ")")
    unowned = [p.path for p in pieces if p.check is not None and p.check.writes_unowned_memory]
    if unowned:
        text += f"; {', '.join(unowned)} writes memory it does not own"
    passed_over = sum(p.check.passed_over for p in pieces if p.check is not None and p.level == "split")
    if passed_over:
        text += (f"; {plural(passed_over, 'scheduled check')} of a split passed over, to keep the checks within "
                 "THUNDERFX_DEBUG_CHECK_SHARE of the training's time")
    return text


def _by_level(pieces: list[CheckedPiece]) -> str:
    """"2 splits, 3 fusion regions"."""
    splits = sum(p.level == "split" for p in pieces)
    return f"{plural(splits, 'split')}, {plural(len(pieces) - splits, 'fusion region')}"


def render_correctness(report: RankRecord) -> list[str]:
    """The summary's section; no lines for a run that checked nothing."""
    pieces = checked_pieces(report)
    if not pieces:
        return []
    lines = [headline(pieces)]
    bad = [p for p in pieces if p.status == "mismatch"]
    for piece in bad[:MAX_LISTED]:
        lines.append(f"  MISMATCH {mismatch_line(piece)}")
        lines += [f"    {text}" for text in origin_lines(piece.sources, piece.reads_saved_from)]
        scripts = [path for label, path in sorted(piece.scripts.items()) if label.startswith("repro_mismatch_")]
        if scripts:
            lines.append(f"    script{'s' if len(scripts) > 1 else ''}: {', '.join(scripts)}")
    if len(bad) > MAX_LISTED:
        lines.append(f"  ... and {len(bad) - MAX_LISTED} more mismatching pieces")
    overwritten = [p for p in pieces if p.check is not None and p.check.overwritten]
    for piece in overwritten[:MAX_LISTED]:
        lines.append(f"  overwritten: {piece.path}: values it returned (or received) changed behind the program's "
                     "back, written by work that writes memory it does not own")
    clean = [p for p in pieces if p.status == "clean"]
    partly_clean = [p for p in pieces if p.status == "partly compared"]
    if clean or partly_clean:
        line = f"  checked clean: {_by_level(clean)}"
        if partly_clean:
            line += f"; partly compared: {_by_level(partly_clean)} (no mismatch, some values not compared: below)"
        lines.append(line)
    uncompared = [p for p in pieces if p.status in ("failed", "not compared")]
    for piece in uncompared[:MAX_LISTED]:
        word = "check failed" if piece.status == "failed" else "not compared"
        lines.append(f"  {word}: {piece.path}: {'; '.join(piece.reasons)}")
    if len(uncompared) > MAX_LISTED:
        lines.append(f"  ... and {len(uncompared) - MAX_LISTED} more pieces not compared")
    partly = [p for p in pieces if p.status in ("partly compared", "mismatch") and p.check.skipped]
    for piece in partly[:MAX_LISTED]:
        lines.append(f"  partly compared: {piece.path}: {'; '.join(piece.check.skipped)}")
    return lines
