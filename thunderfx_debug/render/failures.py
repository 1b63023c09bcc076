"""What the run itself raised (`records.RunFailure`), as the first lines of the summary and of the page: what raised,
in which piece and line of the model's code, when, the script that reproduces it on its own, and the pieces the
failure kept from running."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from thunderfx_debug.records import GraphRecord, RankRecord, RunFailure, short_sources
from thunderfx_debug.render.svg import esc

#: Lines of the model's code named per failure (the rest are counted).
SOURCES_NAMED = 2
#: Pieces the failure kept from running named per failure (the rest are counted).
NOT_RUN_NAMED = 6


def failed_graphs(report: RankRecord) -> list[GraphRecord]:
    return [graph for graph in report.graphs if graph.failure is not None]


def _named(items: tuple[str, ...], shown: int) -> str:
    rest = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {rest} more" if rest > 0 else "")


def _facts(graph: GraphRecord, failure: RunFailure) -> list[tuple[str, str]]:
    """(label, text) of each line after the headline."""
    facts = []
    if failure.raised_at:
        facts.append(("raised at", failure.raised_at + (f": {failure.raised_code}" if failure.raised_code else "")))
    if failure.region:
        facts.append(("in the fusion region", failure.region))
    if failure.sources:
        facts.append(("model code", short_sources(failure.sources, SOURCES_NAMED)))
    if failure.script:
        facts.append(("reproduce", f"python {failure.script}  (RESULT REPRODUCED where it raises the same on its own; "
                                   "`thunderfx-debug verify` runs it)"))
    else:
        facts.append(("reproduce", "no script in this report (the dump holds the scripts: THUNDERFX_DEBUG_DIR)"))
    if failure.not_run:
        facts.append(("never ran", _named(failure.not_run, NOT_RUN_NAMED) + " (the failure came first)"))
    if graph.fallback:
        facts.append(("then", f"{graph.name} ran without Thunder (THUNDERFX_DEBUG_ON_ERROR=fallback)"))
    return facts


def headline(failure: RunFailure) -> str:
    """"graph0/thunder_0 raised AssertionError in the forward of its first call"."""
    return f"{failure.piece} raised {failure.exception} {failure.when}"


def summary_lines(report: RankRecord) -> list[str]:
    """The summary's first lines: one block per graph the run failed in (none where it failed in none)."""
    lines = []
    for graph in failed_graphs(report):
        failure = graph.failure
        lines.append(f"FAILED: {headline(failure)}")
        lines += [f"  {label}: {text}" for label, text in _facts(graph, failure)]
    return lines + [""] if lines else []


def ranks_lines(reports: Mapping[int, RankRecord]) -> list[str]:
    """The first lines of the summary of several ranks: each failure, the rank it was on, and its script (a path
    from the dump's directory)."""
    lines = []
    for rank, report in reports.items():
        for graph in failed_graphs(report):
            failure = graph.failure
            script = f"; reproduce: python rank{rank}/{failure.script}" if failure.script else ""
            lines.append(f"FAILED on rank {rank}: {headline(failure)}{script}")
    return lines + [""] if lines else []


def html_section(report: RankRecord, link: Callable[[str], str]) -> str:
    """The page's first block for a rank whose run failed (empty where it failed in none); `link(path)` makes the
    link to a file of the rank's dump."""
    html = ""
    for graph in failed_graphs(report):
        failure = graph.failure
        rows = []
        for label, text in _facts(graph, failure):
            if label == "reproduce" and failure.script:
                text = f"{link(failure.script)}: {esc(text)}"
            else:
                text = esc(text)
            rows.append(f"<tr><th>{esc(label)}</th><td>{text}</td></tr>")
        html += (f'<div class="failure"><p><span class="flag">FAILED</span> <b>{esc(headline(failure))}</b></p>'
                 f"<table>{''.join(rows)}</table></div>")
    return html
