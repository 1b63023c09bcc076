"""The readable summary of a run: `str(report)`, `summary.txt` and `thunderfx-debug summary`.

`render_summary(report)` renders one rank; `render_ranks(reports)` puts the ranks of a multi-rank dump side by
side (counts and step time per rank, stragglers and ranks that split differently flagged), then details the lowest
rank and how each differing rank differs from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from thunderfx_debug.records import (
    ClockKind, CompileCost, CostWhen, FlushStage, GraphRecord, Phase, RankRecord, SplitKind, Timing, origin_lines,
)
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import (accounting, digest, failures, memory, minimized, next_steps, provenance,
                                    triage_findings)
from thunderfx_debug.render.correctness import describe_check, render_correctness
from thunderfx_debug.render.headline import headline, left_out_calls
from thunderfx_debug.render.text import about_seconds, flagged, ms, plural, shortened

TOP_REGIONS = 10
PARTS_SHOWN = 8  # parts of a split's time listed in the summary (the HTML page lists all)


def _ms(value: float | None) -> str:
    return ms(value, unit=True)


def _first_line(text: str, limit: int = 200) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def _last_line(text: str, limit: int = 300) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:limit] if lines else ""


def _phase_timing_lines(piece, left_out, indent: str) -> list[str]:
    """A graph's or split's forward and backward timing lines, each followed by its time series where it has one."""
    lines = []
    for label, timing, host in (("forward", piece.timing, piece.host_timing),
                                ("backward", piece.backward_timing, piece.host_backward_timing)):
        line = _timing_line(label, timing, left_out, host)
        if line:
            lines.append(f"{indent}{line}")
            series = _time_series_line(timing)
            if series:
                lines.append(f"{indent}  {series}")
    return lines


def _timing_line(label: str, timing: Timing | None, left_out=(), host: Timing | None = None) -> str | None:
    """Headline statistics of a timing (see `headline`), naming its clock, with the host wall time beside device
    time where it was recorded, and a flag for too few samples or too much spread."""
    if timing is None or timing.count == 0:
        return None
    head = headline(timing, left_out)
    sampled = "" if timing.complete else f"; quantiles from a uniform sample of {len(timing.uniform_samples_ms)}"
    if not timing.complete:  # a long run: the quantiles come from its uniform sample (see `sampled`)
        over = f"over {plural(timing.count, 'sample')}"
    elif head.fallback:
        over = f"over {plural(head.basis, 'sample')} (all of them: too few to leave the first or disturbed ones out)"
    else:
        kept = f", {head.left_out} more kept raw (first or disturbed)" if head.left_out else ""
        over = f"over {plural(head.basis, 'sample')}{kept}"
    clock = ("host clock" if timing.clock is not ClockKind.CUDA
             else f"{digest.time_word(timing.clock)} time, {timing.clock.value} clock")
    line = f"{label}: median {_ms(head.median_ms)}, p10 {_ms(head.p10_ms)}, p90 {_ms(head.p90_ms)} {over} ({clock}{sampled})"
    if host is not None and host.count:
        line += f"; host wall median {_ms(headline(host, left_out).median_ms)}"
    return line + (f"  [{head.flag}]" if head.flag else "")


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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def first_step_lines(report: RankRecord) -> list[str]:
    """The first line a reader needs: how long the first step took and where the time went."""
    step = accounting.first_step(report)
    if step is None:
        return []
    kind = digest.clock(report)
    parts = [f"{accounting.stage_words(stage, kind)} {seconds:.1f} s" for stage, seconds in step.parts.items()
             if seconds >= 0.05]
    lines = [f"time to first step: {step.seconds:.1f} s (host wall time from the first compile to the end of the "
             f"first backward, {plural(len(step.graphs), 'graph')}): "
             + ", ".join(parts + [f"other {step.other_s:.1f} s (eager code between graphs, guards, autograd)"])]
    caches = report.meta.get("compile_caches")
    if isinstance(caches, Mapping):
        described = [f"{name} {c.get('hits', 0)} hits / {c.get('misses', 0)} misses" for name, c in caches.items()
                     if isinstance(c, Mapping) and (c.get("hits") or c.get("misses"))]
        if described:
            lines.append("  inductor's caches in this process: " + ", ".join(described)
                         + " (a warm cache makes first steps much shorter)")
    return lines


def step_lines(report: RankRecord) -> list[str]:
    """The step's wall time against the compiled graphs' time, with the idle share of the GPU and the pieces whose
    host time dominates (see `accounting`)."""
    account = accounting.step_account(report)
    if account is None or account.busy_ms is None:
        return []
    steps = account.steps.describe()
    busy = flagged(_ms(account.busy_ms), account.busy_flag)
    if account.wall_ms is None:  # no period timed: the compiled graphs' time alone, named as what it is
        return [f"time in the compiled graphs per step: {busy} ({account.clock.value} clock; {steps}; the step's "
                "wall time was not measured)"]
    wall = f"step: {flagged(_ms(account.wall_ms), account.wall_flag)} wall time (host clock, {account.wall_source})"
    if account.clock is not ClockKind.CUDA:
        return [f"{wall}; {busy} ({100 * account.busy_share:.0f} %) of it in the compiled graphs (on CPU, device "
                f"time is host time); the rest is eager code between graphs, the optimizer, data loading"]
    lines = [f"{wall}; the compiled graphs keep the GPU busy {busy} of it (cuda clock, an upper bound): the GPU "
             f"idles at least {100 * account.idle_share:.0f} % of the step"]
    if account.host_bound:
        lines.append("  host-bound: the host takes longer to launch these pieces than the GPU takes to run them "
                     "(host wall / device time per step):")
        for piece in account.host_pieces[:5]:
            line = f"    {piece.label}: {_ms(piece.host_ms)} / {_ms(piece.device_ms)}"
            if piece.thunder_ms:
                line += f", of which Thunder's own (cache check, prologue, epilogue) {_ms(piece.thunder_ms)}"
            lines.append(line)
    return lines


def flush_lines(report: RankRecord) -> list[str]:
    """What the flush that wrote the dump took, part by part, beside what it said beforehand (host wall time)."""
    cost = report.flush_cost
    if cost is None:
        return []
    parts = []
    for part in sorted(cost.parts, key=lambda p: -p.seconds):
        if part.seconds < 0.05 and part.announced_s is None:
            continue
        bound = "at most " if part.stage is FlushStage.MINIMIZE else ""  # the minimizer's budget
        said = "" if part.announced_s is None else f" (announced: {bound}{about_seconds(part.announced_s)})"
        parts.append(f"{part.stage.value} {part.seconds:.1f} s{said}")
    line = (f"flush ({cost.occasion}): {cost.seconds:.1f} s before writing the files (host wall time)"
            + (": " + ", ".join(parts) if parts else ""))
    if cost.triage_s and not any(p.stage is FlushStage.TRIAGE for p in cost.parts):
        line += f"; the triage, in an earlier flush: {cost.triage_s:.1f} s"
    return [line]


def _cost_line(cost: CompileCost | None) -> str | None:
    """"first call: forward 2.8 s (Thunder tracing 1.2 s, ...), backward 0.4 s (...)"."""
    if cost is None:
        return None
    compile_parts = [f"{p.what.value} {p.seconds:.2f} s" for p in cost.parts if p.when is CostWhen.COMPILE]
    phases = [f"compile ({', '.join(compile_parts)})"] if compile_parts else []
    for when, seconds in ((CostWhen.FORWARD, cost.forward_s), (CostWhen.BACKWARD, cost.backward_s)):
        if seconds is None:
            continue
        parts = [f"{p.what.value} {p.seconds:.2f} s" for p in cost.parts if p.when is when and p.seconds >= 0.005]
        phases.append(f"{when.value} {seconds:.2f} s" + (f" ({', '.join(parts)})" if parts else ""))
    return "first call: " + ", ".join(phases) if phases else None


def _parts_lines(graph: GraphRecord, split) -> list[str]:
    """A thunder split's time by region and op group (fusion-level timing), for each phase."""
    lines = []
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        total, parts = accounting.split_parts(graph, split, phase)
        if total is None or not parts or len(parts) < 2:
            continue
        whole = headline(total, left_out_calls(graph)).median_ms or 0.0
        share = accounting.accounted_share(total, parts, graph)
        shown = [f"{p.label}{f' x{p.count}' if p.count > 1 else ''} {_ms(p.median_ms)}"
                 + (f" {100 * p.median_ms / whole:.0f}%" if whole else "") for p in parts[:PARTS_SHOWN]]
        rest = parts[PARTS_SHOWN:]
        if rest:
            shown.append(f"{len(rest)} more {_ms(sum(p.median_ms for p in rest))}")
        lines.append(f"    {phase.value} by part ({digest.time_word(total.clock)} time, headline medians"
                     + (f", together {100 * share:.0f}% of the split's" if share is not None else "") + "): "
                     + ", ".join(shown))
    return lines


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
    for warning in report.meta.get("environment_warnings", []):
        lines.append(f"warning: {warning}")
    lines += first_step_lines(report)
    lines += step_lines(report)
    lines += ["", "compiles (host wall time; the first forward and backward is where Thunder, nvFuser and inductor "
                  "compile):"]
    rows = [["graph", "compile id", "ops", "calls", "backend call", "first forward", "first backward", "graph break"]]
    for graph in report.graphs:
        cost = graph.compile_cost
        rows.append([graph.name, graph.compile_id or "?", str(graph.node_count), str(graph.calls),
                     _seconds(graph.compile_time_s), _seconds(cost.forward_s if cost else None),
                     _seconds(cost.backward_s if cost else None), _first_line(graph.break_reason or "", 80) or "-"])
    lines += ["  " + line for line in _table(rows, right={2, 3, 4, 5, 6})]
    for frame, graphs in digest.recompiled_frames(report).items():
        lines.append(f"  recompiles: frame {frame} compiled {plural(len(graphs), 'time')} ("
                     + ", ".join(g.compile_id or g.name for g in graphs) + ")")
        for graph in graphs[1:]:
            if graph.recompile_reason:
                lines.append(f"    {graph.compile_id}: {shortened(graph.recompile_reason, 200)}")
    groups = digest.group_reasons(report)
    if groups:
        lines += ["", "split reasons (by type and op):"]
        for type_, members in _by_type(groups).items():
            lines.append(f"  {type_}: {sum(g.count for g in members)}")
            for group in members:
                lines.append(f"    {group.count} x {group.op}  in " + ", ".join(sorted(set(group.places))))
                lines += [f"      exception: {e}" for e in group.exceptions]
    lines += _top_region_lines(report)
    lines += provenance.summary_lines(report)
    correctness = render_correctness(report)
    if correctness:
        lines += ["", *correctness]
    lines += triage_findings.summary_lines(report)
    lines += memory.summary_lines(report)
    lines += minimized.summary_lines(report)
    for warning in report.meta.get("warnings", []):
        lines.append(f"warning: {warning}")
    for failure in report.meta.get("reporting_failures", []):
        if isinstance(failure, Mapping):
            lines.append(f"reporting failure while {failure.get('what')}: {failure.get('error')}")
    lines += flush_lines(report)
    lines += next_steps.next_lines(report)
    return lines


def _top_region_lines(report: RankRecord) -> list[str]:
    """The costliest regions with two shares, each saying what it is a share of: the compiled graphs' time per step
    (what the regions add up to) and, where it was measured, the step's wall time (which also holds eager code,
    the optimizer and data loading)."""
    top = digest.top_regions(report, TOP_REGIONS)
    if not top:
        return []
    word = digest.time_word(digest.clock(report))
    wall = accounting.wall_step_ms(report)
    compiled = digest.compiled_ms_per_step(report)
    whole = "of the compiled graphs' time per step" + (f" ({_ms(compiled)})" if compiled else "")
    if wall:
        whole += f", and of the {_ms(wall)} wall-clock step"
    lines = ["", f"top regions by {word} time (headline median per call x calls per step; share {whole}):"]
    header = ["", "region", "executor", "ms per step", "of compiled"] + (["of wall step"] if wall else []) + [""]
    rows = [header]
    for i, (piece, share) in enumerate(top, 1):
        row = [f"{i}.", piece.label, piece.executor, _ms(piece.ms_per_step), "-" if share is None else f"{100 * share:.1f}%"]
        if wall:
            row.append(f"{100 * piece.ms_per_step / wall:.1f}%")
        rows.append(row + [piece.headline.flag or ""])
    alike = provenance.group_of(report)
    table = _table(rows, right={0, 3, 4, 5} if wall else {0, 3, 4})
    lines.append("  " + table[0])
    for line, (piece, _) in zip(table[1:], top):
        lines.append("  " + line)
        group = alike.get((piece.path, piece.phase)) if piece.level is digest.PieceLevel.FUSION else None
        origins = origin_lines(piece.sources, piece.reads_saved_from)
        if origins and group is not None:
            origins[-1] += f"; {group.describe()}"
        lines += [f"       {text}" for text in origins]
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
        reason = "; ".join(line.strip() for line in graph.recompile_reason.strip().splitlines() if line.strip())
        lines.append(f"  recompiled because: {reason}")  # whole: the guard that failed is the point
    left_out = left_out_calls(graph)
    lines += _phase_timing_lines(graph, left_out, "  ")
    passed_over = digest.timing_passed_over(graph)
    if passed_over:
        lines.append(f"  {passed_over}")
    cost = _cost_line(graph.compile_cost)
    if cost:
        lines.append(f"  {cost}")
    if graph.disturbed:
        lines.append("  left out of the headline statistics: " + ", ".join(
            f"call {d.call} ({d.why.value})" for d in graph.disturbed))
    if graph.failure is not None:
        lines.append(f"  ERROR: {failures.headline(graph.failure)}")
    elif graph.error:
        lines.append(f"  ERROR: {_last_line(graph.error)}")
    for split in graph.splits:
        line = f"  {split.name}: {plural(len(split.ops), 'op')}"
        if split.kind is SplitKind.THUNDER:
            line += (f", fusions: {len(split.fusions_in(Phase.FORWARD))} forward, "
                     f"{len(split.fusions_in(Phase.BACKWARD))} backward")
        lines.append(line)
        lines += [f"    {text}" for text in origin_lines(split.sources)]
        lines += _phase_timing_lines(split, left_out, "    ")
        cost = _cost_line(split.compile_cost)
        if cost:
            lines.append(f"    {cost}")
        if split.check is not None:
            word = "MISMATCH " if split.check.mismatched else "CHECK FAILED " if split.check.failures else ""
            lines.append(f"    check: {word}{describe_check(split.check)}")
        for group in digest.group_reasons([GraphRecord(graph.name, graph.index, splits=(split,))]):
            lines.append(f"    split reason: {group.type} {group.op}" + (f" (x{group.count})" if group.count > 1 else ""))
            lines += [f"      exception: {e}" for e in group.exceptions]
        if split.fusions:
            by_executor = Counter(f.executor for f in split.fusions)
            lines.append("    fusion executors: " + ", ".join(f"{n} {ex}" for ex, n in sorted(by_executor.items())))
            lines += _fusion_lines(split, left_out)
        for key, timing in sorted(split.outside_fusions_timing.items()):
            line = _timing_line(f"outside fusions, {digest.outside_phase(key)}", timing, left_out)
            if line:
                lines.append(f"    {line}")
        lines += _parts_lines(graph, split)
        if graph.failure is not None and graph.failure.piece == PieceKey.of(graph.name, split.name):
            lines.append(f"    ERROR: {graph.failure.exception} {graph.failure.when}")
        elif split.error:
            lines.append(f"    ERROR: {_last_line(split.error)}")
        elif graph.failure is not None and PieceKey.of(graph.name, split.name) in graph.failure.not_run:
            lines.append(f"    never ran: {graph.failure.piece} raised before it")
    for reason in graph.unattributed_reasons:
        lines.append(f"  split reason (no split): {reason.type} {digest.reason_op(reason)[:120]}")
    return lines


def _fusion_line(fusion, left_out) -> str:
    line = f"      {fusion.name} ({fusion.phase.value}, {fusion.executor}): {plural(len(fusion.ops), 'op')}"
    if fusion.timing is not None and fusion.timing.count:
        head = headline(fusion.timing, left_out)
        line += f", median {_ms(head.median_ms)}" + (f"  [{head.flag}]" if head.flag else "")
    if fusion.check is not None:
        c = fusion.check
        word = ("MISMATCH" if c.mismatched else "check failed" if c.failures else "partly compared"
                if c.partly_compared else "ok" if c.compared else "not compared")
        if c.writes_unowned_memory:
            word += ", writes memory it does not own"
        line += f", check: {word} ({c.calls} calls)"
    return line


def _unremarkable(fusion) -> bool:
    """A region whose line says nothing its alike regions' does not: unchecked or checked clean, not triaged."""
    c = fusion.check
    return fusion.triage is None and fusion.minimized is None and (
        c is None or not (c.mismatched or c.failures or c.writes_unowned_memory or c.overwritten))


def _fusion_lines(split, left_out) -> list[str]:
    """A split's regions, each with its sources (and the lines that made the saved values it reads); the regions that
    repeat an earlier region's lines and ops (a model's layers) in one line after it, unless their own check or
    triage says something of them."""
    shown: list[tuple] = []  # (region, the alike regions told after it)
    followers: dict[tuple, list] = {}
    for fusion in split.fusions:
        key = (fusion.executor, fusion.phase, fusion.ops, fusion.sources, fusion.reads_saved_from)
        if (fusion.sources or fusion.reads_saved_from) and key in followers and _unremarkable(fusion):
            followers[key].append(fusion)
            continue
        own: list = []
        followers.setdefault(key, own)
        shown.append((fusion, own))
    lines = []
    for fusion, alike in shown:
        lines.append(_fusion_line(fusion, left_out))
        lines += [f"        {text}" for text in origin_lines(fusion.sources, fusion.reads_saved_from)]
        if alike:
            medians = [headline(f.timing, left_out).median_ms for f in alike if f.timing is not None and f.timing.count]
            span = (f", median {_ms(medians[0])}" if len(medians) == 1 else
                    f", medians {_ms(min(medians))} to {_ms(max(medians))}" if medians else "")
            lines.append(f"        the same lines and ops in {plural(len(alike), 'more region')}{span}: "
                         + ", ".join(f.name for f in alike))
    return lines


def render_summary(report: RankRecord) -> str:
    """The summary of one rank (what `str(report)` prints): what the run raised first, where it raised."""
    lines = failures.summary_lines(report) + render_overview(report)
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
    table = [["rank", *keys, "compiled ms per step", "flags"]]
    for row in rows_by_rank:
        flags = [flag for flag, on in (("STRAGGLER", row.straggler), ("SPLITS DIFFERENTLY", row.splits_differently)) if on]
        table.append([str(row.rank), *(str(row.counts[k]) for k in keys), _ms(row.compiled_ms),
                      " ".join(flags) or "-"])
    lines = failures.ranks_lines(reports)
    lines += [f"thunderfx_debug report of {plural(len(reports), 'rank')} (ranks {', '.join(map(str, reports))})", ""]
    lines += _table(table, right=set(range(len(keys) + 2)))
    lines += ["", "time per graph and rank (median forward + backward):"]
    names = sorted({g.name for r in reports.values() for g in r.graphs}, key=_natural)
    per_graph = [["graph", *(f"rank {r}" for r in reports)]]
    for name in names:
        per_graph.append([name, *(_graph_ms(report, name) for report in reports.values())])
    lines += ["  " + line for line in _table(per_graph, right=set(range(1, len(reports) + 1)))]
    lines += ["", *render_straggler_view(reports)]
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


def _signed_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def render_straggler_view(reports: Mapping[int, RankRecord]) -> list[str]:
    """The ranks' steps, their spread, the slowest rank's costliest pieces against the same pieces on the other
    ranks, and what the figures count of the collectives (see `render.ranks`)."""
    from thunderfx_debug.render import ranks

    steps = ranks.rank_steps(reports)
    clock = next((s.clock for s in steps if s.clock is not None), None)
    if clock is None:
        lines = ["the straggler view: no rank timed its graphs (THUNDERFX_DEBUG_TIMING=off, or too few calls)"]
    else:
        lines = [f"the straggler view (compiled time per step: the graphs' forward and backward, median per call x "
                 f"calls per step; {ranks.clock_words(clock)}):"]
        rows = [["rank", "compiled step", "collectives in graphs", "step wall time (host clock)"]]
        rows += [[str(s.rank), _ms(s.compiled_ms), _ms(s.collective_ms), _ms(s.wall_ms)] for s in steps]
        lines += ["  " + line for line in _table(rows, right={0, 1, 2, 3})]
    spread = ranks.spread(steps)
    if spread is not None:
        lines.append(
            f"  spread: rank {spread.slowest} slowest ({_ms(spread.slowest_ms)}), rank {spread.fastest} fastest "
            f"({_ms(spread.fastest_ms)}): {spread.ratio:.2f}x; rank {spread.slowest} is {_ms(spread.excess_ms)} per "
            f"step above the median of the others")
        pieces = ranks.slowest_pieces(reports, spread.slowest)
        if pieces:
            lines.append(f"  rank {spread.slowest}'s costliest pieces against the other ranks (ms per step):")
            table = [["piece", "executor", *(f"rank {r}" for r in reports), f"rank {spread.slowest} - others"]]
            for piece in pieces:
                table.append([piece.label, piece.executor,
                              *(ms(piece.ms_per_step[r]) if piece.ms_per_step[r] is not None else "absent"
                                for r in reports), _signed_ms(piece.excess_ms)])
            lines += ["    " + line for line in _table(table, right=set(range(2, len(reports) + 3)))]
            explained = sum(p.excess_ms for p in pieces if p.excess_ms is not None)
            every = ranks.pieces_across_ranks(reports, spread.slowest)
            rest = sum(p.excess_ms for p in every if p.excess_ms is not None) - explained
            outside = spread.excess_ms - explained - rest
            lines.append(f"    of its {_ms(spread.excess_ms)} per step above the others: these pieces "
                         f"{_signed_ms(explained)} ms, its other {plural(len(every) - len(pieces), 'piece')} "
                         f"{_signed_ms(rest)} ms, and {_signed_ms(outside)} ms in the graphs outside their timed "
                         "pieces (between splits; and medians do not add up exactly)")
    for rank, report in reports.items():
        for place in ranks.collective_places(report):
            lines.append(f"  collectives on rank {rank} in {place.place} ({place.kind}): {', '.join(place.ops)}")
    buckets = {rank: ranks.ddp_buckets(report) for rank, report in reports.items()}
    alike = len({repr(b) for b in buckets.values()}) == 1
    for rank, by_compile in (list(buckets.items())[:1] if alike else buckets.items()):
        for compile_id, graphs in by_compile.items():
            lines.append(f"  DDP {'on every rank' if alike else f'on rank {rank}'}: DDP's optimizer split compile "
                         f"{compile_id} into {plural(len(graphs), 'graph')}, one per gradient bucket "
                         f"({', '.join(graphs)})")
    lines += _flight_recorder_lines(reports)
    lines += [f"  note: {note}" for note in ranks.outside_graphs_note(reports)]
    return lines


def _flight_recorder_lines(reports: Mapping[int, RankRecord]) -> list[str]:
    from thunderfx_debug.render import ranks

    lines = []
    lags = ranks.arrival_lags(reports)
    if lags is not None:
        clocks = "one host's clock" if lags.same_host else "the hosts' clocks, which may be offset"
        lines.append(f"  collectives outside the graphs (torch's flight recorder): {lags.matched} found on every rank, "
                     f"over {lags.span_s:.1f} s; when each rank enqueued them ({clocks}):")
        table = [["rank", "enqueued last", "median lag behind the first", "total lag"]]
        table += [[str(r), f"{lags.last[r]} of {lags.matched}", _ms(lags.median_lag_ms[r]), _ms(lags.total_lag_ms[r])]
                  for r in lags.last]
        lines += ["    " + line for line in _table(table, right={0, 1, 2, 3})]
        late = lags.latest
        if late is not None:
            lines.append(f"    rank {late} enqueued latest; the other ranks waited for it about its lag (a "
                         "collective completes once its last rank has enqueued it)")
        elsewhere = ranks.late_outside_graphs(ranks.rank_steps(reports), lags)
        if elsewhere is not None:
            lines.append(f"    {elsewhere}")
    times = ranks.collective_times(reports)
    if times:
        lines.append("  device time of the collectives where c10d timed them (median per call, count, total; a rank "
                     "that waits for the others spends longest):")
        table = [["collective", *(f"rank {r}" for r in reports)]]
        for row in times:
            table.append([row.name, *(f"{ms(row.by_rank[r][1])} x{row.by_rank[r][0]} = {_ms(row.by_rank[r][2])}"
                                      if r in row.by_rank else "-" for r in reports)])
        lines += ["    " + line for line in _table(table, right=set(range(1, len(reports) + 1)))]
    return lines
