"""The readable summary of a run: `str(report)`, `summary.txt` and `thunderfx-debug summary`.

`render_summary(report)` renders one rank; `render_ranks(reports)` puts the ranks of a multi-rank dump side by
side (counts and step time per rank, stragglers and ranks that split differently flagged), then details the lowest
rank and how each differing rank differs from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from thunderfx_debug.records import GraphRecord, Phase, RankRecord, SplitKind, Timing
from thunderfx_debug.render import digest
from thunderfx_debug.render.text import ms, plural

TOP_REGIONS = 10


def _ms(value: float | None) -> str:
    return ms(value, unit=True)


def _first_line(text: str, limit: int = 200) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def _last_line(text: str, limit: int = 300) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:limit] if lines else ""


def _timing_line(label: str, timing: Timing | None) -> str | None:
    if timing is None or timing.count == 0:
        return None
    sampled = "" if timing.complete else f"; quantiles from a uniform sample of {len(timing.uniform_samples_ms)}"
    return (
        f"{label}: median {_ms(timing.median_ms)}, p10 {_ms(timing.p10_ms)}, p90 {_ms(timing.p90_ms)} "
        f"over {plural(timing.count, 'sample')} ({timing.clock.value} clock{sampled})"
    )


#: A time series is shown from this many windows on (a short run's few samples say nothing about trends).
MIN_WINDOWS_SHOWN = 8
SPARK_LEVELS = " .:-=+*#%@"  # ASCII: summary.txt is read in any terminal
SPARK_WIDTH = 32


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """Values as one character each, from " " (0) to "@" (the largest), at most `width` characters (neighbours
    grouped, each group showing its largest value, so a slow stretch is never averaged away).

    Example:
        >>> sparkline([1.0, 1.0, 1.0, 2.0, 1.0, 1.5])
        '===@=#'
    """
    if not values:
        return ""
    group = -(-len(values) // width)
    grouped = [max(values[i:i + group]) for i in range(0, len(values), group)]
    top = max(grouped)
    if top <= 0:
        return SPARK_LEVELS[0] * len(grouped)
    last = len(SPARK_LEVELS) - 1
    return "".join(SPARK_LEVELS[min(last, round(last * v / top))] for v in grouped)


def _time_series_line(timing: Timing | None) -> str | None:
    """How the piece's median evolved over the run, in one line (see `records.TimingWindow`)."""
    if timing is None or len(timing.windows) < MIN_WINDOWS_SHOWN:
        return None
    windows = timing.windows
    lowest = min(windows, key=lambda w: w.median_ms)
    highest = max(windows, key=lambda w: w.median_ms)
    return (
        f"over the run, median per window of {windows[0].count} samples (calls {windows[0].first_call}-"
        f"{windows[-1].last_call}): first {_ms(windows[0].median_ms)}, last {_ms(windows[-1].median_ms)}, lowest "
        f"{_ms(lowest.median_ms)} (calls {lowest.first_call}-{lowest.last_call}), highest {_ms(highest.median_ms)} "
        f"(calls {highest.first_call}-{highest.last_call})  [{sparkline([w.median_ms for w in windows])}]"
    )


def _table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    """Rows of cells as aligned text columns (`right`: indices of right-aligned columns)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]


def render_overview(report: RankRecord) -> list[str]:
    """Counts, step time, compiles and recompiles, grouped split reasons and the costliest regions."""
    c = digest.counts(report)
    lines = [
        f"thunderfx_debug report (rank {report.rank}): {plural(c['graphs'], 'Dynamo graph')}, "
        f"{plural(c['thunder splits'], 'thunder split')}, {plural(c['inductor splits'], 'inductor split')}, "
        f"{plural(c['forward fusions'] + c['backward fusions'], 'fusion region')} ({c['forward fusions']} forward, "
        f"{c['backward fusions']} backward)"
    ]
    step = digest.step_ms(report)
    if step is not None:
        lines.append(
            f"step: {_ms(step)} of compiled time per step ({digest.clock(report).value} clock; "
            f"{plural(digest.estimated_steps(report), 'step')} estimated from the graphs' calls)"
        )
    lines += ["", "compiles:"]
    rows = [["graph", "compile id", "ops", "calls", "compile", "graph break"]]
    for graph in report.graphs:
        compile_s = "-" if graph.compile_time_s is None else f"{graph.compile_time_s:.1f} s"
        rows.append([graph.name, graph.compile_id or "?", str(graph.node_count), str(graph.calls), compile_s,
                     _first_line(graph.break_reason or "", 80) or "-"])
    lines += ["  " + line for line in _table(rows, right={2, 3, 4})]
    for frame, graphs in digest.recompiled_frames(report).items():
        lines.append(f"  recompiles: frame {frame} compiled {plural(len(graphs), 'time')} ("
                     + ", ".join(g.compile_id or g.name for g in graphs) + ")")
        for graph in graphs[1:]:
            if graph.recompile_reason:
                lines.append(f"    {graph.compile_id}: {_first_line(graph.recompile_reason)}")
    groups = digest.group_reasons(report)
    if groups:
        lines += ["", "split reasons (by type and op):"]
        for type_, members in _by_type(groups).items():
            lines.append(f"  {type_}: {sum(g.count for g in members)}")
            for group in members:
                lines.append(f"    {group.count} x {group.op}  in " + ", ".join(sorted(set(group.places))))
                lines += [f"      exception: {e}" for e in group.exceptions]
    top = digest.top_regions(report, TOP_REGIONS)
    if top:
        lines += ["", "top regions by device time (median per call x calls per step, share of the step):"]
        rows = [[f"{i}.", piece.label, piece.executor, _ms(piece.ms_per_step),
                 "-" if share is None else f"{100 * share:.1f}%"] for i, (piece, share) in enumerate(top, 1)]
        lines += ["  " + line for line in _table(rows, right={0, 3, 4})]
    for warning in report.meta.get("warnings", []):
        lines.append(f"warning: {warning}")
    for failure in report.meta.get("reporting_failures", []):
        if isinstance(failure, Mapping):
            lines.append(f"reporting failure while {failure.get('what')}: {failure.get('error')}")
    return lines


def _by_type(groups: list[digest.ReasonGroup]) -> dict[str, list[digest.ReasonGroup]]:
    by_type: dict[str, list[digest.ReasonGroup]] = {}
    for group in groups:
        by_type.setdefault(group.type, []).append(group)
    return dict(sorted(by_type.items(), key=lambda item: -sum(g.count for g in item[1])))


def render_graph(graph: GraphRecord) -> list[str]:
    """One graph: its splits, their timings, split reasons and fusions per split."""
    thunder = [s for s in graph.splits if s.kind is SplitKind.THUNDER]
    inductor = [s for s in graph.splits if s.kind is SplitKind.INDUCTOR]
    header = (f"{graph.name} (compile id {graph.compile_id or '?'}): {plural(graph.node_count, 'op')}, "
              f"{plural(graph.calls, 'call')}, splits: {len(thunder)} thunder, {len(inductor)} inductor")
    if graph.fallback:
        header += "  [FELL BACK TO INDUCTOR]"
    lines = [header]
    if graph.break_reason:
        lines.append(f"  graph break: {_first_line(graph.break_reason)}")
    if graph.recompile_reason:
        lines.append(f"  recompiled because: {_first_line(graph.recompile_reason)}")
    for label, timing in (("forward", graph.timing), ("backward", graph.backward_timing)):
        line = _timing_line(label, timing)
        if line:
            lines.append(f"  {line}")
            series = _time_series_line(timing)
            if series:
                lines.append(f"    {series}")
    if graph.error:
        lines.append(f"  ERROR: {_last_line(graph.error)}")
    for split in graph.splits:
        line = f"  {split.name}: {plural(len(split.ops), 'op')}"
        if split.kind is SplitKind.THUNDER:
            line += (f", fusions: {len(split.fusions_in(Phase.FORWARD))} forward, "
                     f"{len(split.fusions_in(Phase.BACKWARD))} backward")
        lines.append(line)
        for label, timing in (("forward", split.timing), ("backward", split.backward_timing)):
            line = _timing_line(label, timing)
            if line:
                lines.append(f"    {line}")
                series = _time_series_line(timing)
                if series:
                    lines.append(f"      {series}")
        for group in digest.group_reasons([GraphRecord(graph.name, graph.index, splits=(split,))]):
            lines.append(f"    split reason: {group.type} {group.op}" + (f" (x{group.count})" if group.count > 1 else ""))
            lines += [f"      exception: {e}" for e in group.exceptions]
        if split.fusions:
            by_executor = Counter(f.executor for f in split.fusions)
            lines.append("    fusion executors: " + ", ".join(f"{n} {ex}" for ex, n in sorted(by_executor.items())))
            for fusion in split.fusions:
                line = f"      {fusion.name} ({fusion.phase.value}, {fusion.executor}): {plural(len(fusion.ops), 'op')}"
                if fusion.timing is not None and fusion.timing.count:
                    line += f", median {_ms(fusion.timing.median_ms)}"
                lines.append(line)
        for key, timing in sorted(split.outside_fusions_timing.items()):
            line = _timing_line(f"outside fusions, {digest.outside_phase(key)}", timing)
            if line:
                lines.append(f"    {line}")
        if split.error:
            lines.append(f"    ERROR: {_last_line(split.error)}")
    for reason in graph.unattributed_reasons:
        lines.append(f"  split reason (no split): {reason.type} {digest.reason_op(reason)[:120]}")
    return lines


def render_summary(report: RankRecord) -> str:
    """The summary of one rank (what `str(report)` prints)."""
    lines = render_overview(report)
    for graph in report.graphs:
        lines.append("")
        lines.extend(render_graph(graph))
    return "\n".join(lines) + "\n"


def render_ranks(reports: Mapping[int, RankRecord]) -> str:
    """Ranks side by side, then the lowest rank in full and how each rank that split differently differs."""
    if len(reports) == 1:
        return render_summary(next(iter(reports.values())))
    from thunderfx_debug.render.diff import diff_reports, render_structure_changes

    rows_by_rank = digest.compare_ranks(reports)
    keys = ["graphs", "thunder splits", "inductor splits", "forward fusions", "backward fusions", "split reasons",
            "recompiles", "errors"]
    table = [["rank", *keys, "step", "flags"]]
    for row in rows_by_rank:
        flags = [flag for flag, on in (("STRAGGLER", row.straggler), ("SPLITS DIFFERENTLY", row.splits_differently)) if on]
        table.append([str(row.rank), *(str(row.counts[k]) for k in keys), _ms(row.step_ms), " ".join(flags) or "-"])
    lines = [f"thunderfx_debug report of {plural(len(reports), 'rank')} (ranks {', '.join(map(str, reports))})", ""]
    lines += _table(table, right=set(range(len(keys) + 2)))
    lines += ["", "time per graph and rank (median forward + backward):"]
    names = sorted({g.name for r in reports.values() for g in r.graphs}, key=_natural)
    per_graph = [["graph", *(f"rank {r}" for r in reports)]]
    for name in names:
        per_graph.append([name, *(_graph_ms(report, name) for report in reports.values())])
    lines += ["  " + line for line in _table(per_graph, right=set(range(1, len(reports) + 1)))]
    base_rank, base = next(iter(reports.items()))
    for row in rows_by_rank:
        if row.splits_differently or (row.rank != base_rank and digest.structure(reports[row.rank]) != digest.structure(base)):
            lines += ["", f"rank {row.rank} against rank {base_rank}:"]
            lines += ["  " + line for line in render_structure_changes(diff_reports(base, reports[row.rank]))]
    lines += ["", f"---- rank {base_rank} in full ----", render_summary(base).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _graph_ms(report: RankRecord, name: str) -> str:
    try:
        graph = report.graph(name)
    except KeyError:
        return "absent"
    medians = [t.median_ms for t in (graph.timing, graph.backward_timing) if t is not None and t.count]
    return _ms(sum(medians)) if medians else "untimed"


def _natural(name: str) -> tuple:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1)
