"""The readable summary of a Report (`str(report)`, `summary.txt`, `thunderfx-debug summary`)."""

from __future__ import annotations

from collections import Counter

from thunderfx_debug.records import GraphRecord, Phase, Report, SplitKind, SplitReason, Timing


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def _timing_line(label: str, timing: Timing | None) -> str | None:
    if timing is None or timing.count == 0:
        return None
    return (
        f"{label}: median {_ms(timing.median_ms)}, p10 {_ms(timing.p10_ms)}, p90 {_ms(timing.p90_ms)} "
        f"over {timing.count} samples ({timing.clock} clock)"
    )


def group_reasons(reasons: list[SplitReason]) -> list[tuple[str, str, int]]:
    """(type, op, count) for split reasons, most frequent first."""
    counts = Counter((r.type, r.op or r.info.split(",")[0]) for r in reasons)
    return [(t, op, n) for (t, op), n in counts.most_common()]


def render_graph(graph: GraphRecord) -> list[str]:
    lines = []
    thunder = [s for s in graph.splits if s.kind is SplitKind.THUNDER]
    inductor = [s for s in graph.splits if s.kind is SplitKind.INDUCTOR]
    header = f"{graph.name} (compile id {graph.compile_id or '?'}): {graph.node_count} ops, {graph.calls} calls"
    header += f", {len(thunder)} thunder / {len(inductor)} inductor splits"
    if graph.fallback:
        header += "  [FELL BACK TO INDUCTOR]"
    lines.append(header)
    if graph.break_reason:
        lines.append(f"  graph break: {graph.break_reason.strip().splitlines()[0][:200]}")
    if graph.recompile_reason:
        lines.append(f"  recompiled because: {graph.recompile_reason.strip().splitlines()[0][:200]}")
    for label, timing in (("forward", graph.timing), ("backward", graph.backward_timing)):
        line = _timing_line(label, timing)
        if line:
            lines.append(f"  {line}")
    if graph.error:
        lines.append(f"  ERROR: {graph.error.strip().splitlines()[-1][:300]}")
    for split in graph.splits:
        fusions = split.fusions
        lines.append(
            f"  {split.name}: {len(split.ops)} ops"
            + (
                f", {len(split.fusions_in(Phase.FORWARD))} forward / {len(split.fusions_in(Phase.BACKWARD))} backward fusions"
                if split.kind is SplitKind.THUNDER
                else ""
            )
        )
        for label, timing in (("forward", split.timing), ("backward", split.backward_timing)):
            line = _timing_line(label, timing)
            if line:
                lines.append(f"    {line}")
        for type_, op, count in group_reasons(list(split.reasons)):
            lines.append(f"    split reason: {type_} {op}" + (f" (x{count})" if count > 1 else ""))
        for reason in split.reasons:
            if reason.exception:
                lines.append(f"      exception: {reason.exception.strip().splitlines()[-1][:200]}")
        if fusions:
            by_executor = Counter(f.executor for f in fusions)
            lines.append("    fusions: " + ", ".join(f"{n} {ex}" for ex, n in sorted(by_executor.items())))
            for fusion in fusions:
                line = f"      {fusion.name} ({fusion.phase.value}, {fusion.executor}): {len(fusion.ops)} ops"
                if fusion.timing is not None and fusion.timing.count:
                    line += f", median {_ms(fusion.timing.median_ms)}"
                lines.append(line)
        if split.error:
            lines.append(f"    ERROR: {split.error.strip().splitlines()[-1][:300]}")
    for reason in graph.unattributed_reasons:
        lines.append(f"  split reason (no split): {reason.type} {reason.op or reason.info[:120]}")
    return lines


def render_summary(report: Report) -> str:
    graphs = report.graphs
    splits = [s for g in graphs for s in g.splits]
    fusions = [f for s in splits for f in s.fusions]
    lines = [
        f"thunderfx_debug report (rank {report.rank}): {len(graphs)} Dynamo graphs, "
        f"{sum(s.kind is SplitKind.THUNDER for s in splits)} thunder splits, "
        f"{sum(s.kind is SplitKind.INDUCTOR for s in splits)} inductor splits, {len(fusions)} fusion regions",
    ]
    all_reasons = [r for g in graphs for r in g.reasons]
    if all_reasons:
        lines.append("split reasons:")
        for type_, op, count in group_reasons(all_reasons):
            lines.append(f"  {count} x {type_}: {op}")
    for warning in report.meta.get("warnings", []):
        lines.append(f"warning: {warning}")
    for failure in report.meta.get("reporting_failures", []):
        lines.append(f"reporting failure while {failure.get('what')}: {failure.get('error')}")
    for graph in graphs:
        lines.append("")
        lines.extend(render_graph(graph))
    return "\n".join(lines) + "\n"
