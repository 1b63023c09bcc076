"""What the summary suggests doing next, from what the records hold: the page, `verify` where the dump has repro
scripts (the setting that writes them where it has none), `minimize` for a mismatch not shrunk yet, and where a
finding about Thunder or nvFuser goes, with what to attach (docs/minimize-and-filing-a-bug.md)."""

from __future__ import annotations

import shlex

from thunderfx_debug.records import RankRecord, SplitKind, layout

THUNDER_ISSUES = "https://github.com/Lightning-AI/lightning-thunder/issues"
NVFUSER_ISSUES = "https://github.com/NVIDIA/Fuser/issues"


def _scripts(report: RankRecord) -> list[tuple[str, str]]:
    """(label, path) of every script the records list, graphs first."""
    found = []
    for graph in report.graphs:
        found += [(label, path) for label, path in graph.files.items() if path.endswith(".py")]
        for split in graph.splits:
            found += [(label, path) for label, path in split.files.items() if path.endswith(".py")]
            for fusion in split.fusions:
                found += [(label, path) for label, path in fusion.files.items() if path.endswith(".py")]
    return [(label, path) for label, path in found if label.startswith("repro_")]  # what `verify` runs


def _findings(report: RankRecord) -> tuple[list[str], list[str], bool]:
    """(mismatch scripts of pieces not minimized yet, minimal scripts, whether a finding concerns nvFuser)."""
    to_shrink, minimal, nvfuser = [], [], False
    for graph in report.graphs:
        for split in graph.splits:
            pieces = [(split, split.kind is SplitKind.THUNDER and "thunder")] + [(f, f.executor) for f in split.fusions]
            for piece, executor in pieces:
                bad = piece.check is not None and piece.check.mismatched
                if piece.minimized is not None and piece.minimized.script:
                    minimal.append(piece.minimized.script)
                elif bad:
                    to_shrink += [path for label, path in sorted(piece.files.items())
                                  if label.startswith("repro_mismatch_")][:1]
                if bad and executor == "nvfuser":
                    nvfuser = True
    return to_shrink, minimal, nvfuser


def next_lines(report: RankRecord) -> list[str]:
    """The summary's "next:" section; none where the records name no dump directory (`report()` without one)."""
    config = report.meta.get("config")
    root = config.get("dump_dir") if isinstance(config, dict) else None
    if not root:
        return []
    shown = shlex.quote(str(root))
    rank = f"{root}/{layout.rank_dir_name(report.rank)}"
    commands = [(f"thunderfx-debug html {shown}", "one page: charts, split reasons, traces, links to the scripts")]
    scripts = _scripts(report)
    if scripts:
        commands.append((f"thunderfx-debug verify {shown}", "run every repro script of the dump and say what each "
                                                           f"found ({len(scripts)} of them)"))
    to_shrink, minimal, nvfuser = _findings(report)
    for script in to_shrink[:3]:
        commands.append((f"thunderfx-debug minimize {shlex.quote(f'{rank}/{script}')}",
                         "shrink a mismatch to the fewest ops that still fail the same way"))
    lines = ["", "next:"]
    width = max(len(command) for command, _ in commands)
    lines += [f"  {command.ljust(width)}  # {what}" for command, what in commands]
    if not scripts:
        lines.append("  THUNDERFX_DEBUG_REPRO=split (or all) writes a repro script for each split, which verify runs")
    if to_shrink or minimal:
        where = THUNDER_ISSUES + (f" (an nvFuser region's: {NVFUSER_ISSUES})" if nvfuser else "")
        lines.append(f"  a mismatch is a finding worth filing at {where}, with its "
                     + ("minimal script" if minimal else "mismatch script (shrunk first)")
                     + " and the versions line under its header: docs/minimize-and-filing-a-bug.md says what to "
                       "attach")
    return lines
