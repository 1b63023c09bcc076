"""One self-contained HTML page of a dump (`thunderfx-debug html`): charts, tables, traces and links to the repro
scripts, for one rank or several side by side.

Self-contained and inert: inline CSS and inline SVG only, no script at all, nothing fetched; a Content-Security-Policy
forbids scripts and every network load, so even a dump crafted to inject markup could not run code. Everything read
from the dump is escaped (`svg.esc`), and links are made only from paths that stay inside the dump
(`layout.safe_relative`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from urllib.parse import quote

from thunderfx_debug.records import layout
from thunderfx_debug.records import READS_SAVED, Check, ClockKind, GraphRecord, Phase, RankRecord, SplitKind, Timing
from thunderfx_debug.render import (
    accounting, correctness, digest, failures, memory, minimized, provenance, triage_findings,
)
from thunderfx_debug.render.digest import PieceLevel
from thunderfx_debug.render.headline import headline, left_out_calls
from thunderfx_debug.render.svg import Bar, Series, bar_chart, esc, timeline
from thunderfx_debug.render.text import flagged, ms, plural, shortened

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
MAX_TRACE_CHARS = 400_000  # a trace beyond this is cut in the page (the file in the dump is whole)

#: In the correctness table, text breaks anywhere (unlike `break-word`, `anywhere` counts in a table's column
#: widths, so that a long parameter name breaks instead of widening the table past a laptop's width) and numbers
#: never break.
STYLE = """
body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1300px}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-top:.6em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.4em 0 1em}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;
vertical-align:top;font-size:13px}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.flag,.neutral,.calm{padding:0 5px;border-radius:3px;font-size:12px}.flag{color:#fff;background:#c0392b}
.neutral{color:#222;background:#f6c343}.calm{color:#fff;background:#2e7d32}
td>.flag,td>.neutral,td>.calm{white-space:nowrap}
table.checks td{overflow-wrap:anywhere}table.checks td.num{white-space:nowrap;overflow-wrap:normal}
table.checks tr.note td{color:#555;border-top:0}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:500px;font-size:12px}
details{margin:.3em 0}summary{cursor:pointer}.muted{color:#777}.chart{display:block;margin:.4em 0 1em}
.src{background:#fff3b0;font-weight:bold}
"""


def _median(timing: Timing | None, left_out=()) -> float | None:
    """The headline median (see `headline`)."""
    return headline(timing, left_out).median_ms if timing is not None and timing.count else None


def _first_step(report: RankRecord) -> str:
    """The page leads with this: how long the first step took, and where the time went."""
    step = accounting.first_step(report)
    if step is None:
        return ""
    kind = digest.clock(report)
    bars = [Bar(accounting.stage_words(stage, kind), seconds, stage.value) for stage, seconds in step.parts.items()]
    bars.append(Bar("other (eager code between graphs, guards, autograd)", step.other_s, "other"))
    html = (f"<h3>Time to first step: {step.seconds:.1f} s</h3><p>Host wall time from the first compile to the end of "
            f"the first backward ({esc(', '.join(step.graphs))}), and where it went. Thunder, nvFuser and inductor "
            "compile at a graph's first call, not in the backend call.</p>")
    html += bar_chart(bars, unit="s", title="where the first step went", value_format="{:.2f}")
    caches = report.meta.get("compile_caches")
    if isinstance(caches, Mapping):
        described = [f"{name} {c.get('hits', 0)} hits / {c.get('misses', 0)} misses" for name, c in caches.items()
                     if isinstance(c, Mapping) and (c.get("hits") or c.get("misses"))]
        if described:
            html += f"<p>Inductor's caches in this process: {esc(', '.join(described))}.</p>"
    return html


def _step(report: RankRecord) -> str:
    account = accounting.step_account(report)
    if account is None or account.wall_ms is None or account.busy_ms is None:
        return ""
    wall = esc(flagged(ms(account.wall_ms, unit=True), account.wall_flag))
    busy = esc(flagged(ms(account.busy_ms, unit=True), account.busy_flag))
    if account.clock is not ClockKind.CUDA:
        return (f"<p>Step: {wall} wall time (host clock, {esc(account.wall_source)}), {busy} "
                f"({100 * account.busy_share:.0f} %) of it in the "
                "compiled graphs. On CPU, device time is host time; the rest of the step is eager code between "
                "graphs, the optimizer and data loading.</p>")
    html = (f"<p>Step: {wall} wall time (host clock, {esc(account.wall_source)}); the compiled graphs keep the GPU "
            f"busy {busy} of it (cuda clock; an upper bound: CUDA events around each graph also count "
            f"the device's waits for the host): <b>the GPU idles at least {100 * account.idle_share:.0f} % of the "
            "step</b>. Not in busy: eager code between graphs, the optimizer, data loading.</p>")
    if account.host_bound and account.host_pieces:
        rows = [[esc(p.label), ms(p.host_ms), ms(p.device_ms), ms(p.thunder_ms)] for p in account.host_pieces[:10]]
        html += ("<p><span class=\"flag\">host-bound</span> The host takes longer to launch these pieces than the "
                 "GPU takes to run them (ms per step):</p>"
                 + _table(["piece", "host wall", "device", "of which Thunder's own"], rows, {1, 2, 3}))
    return html


def _without_empty(header: list[str], rows: list[list[str]], numeric: set[int], optional: set[int]):
    """The table without those of the `optional` columns that hold nothing but "-" (e.g. host wall time, which CPU
    runs do not record beside their host-clock timings)."""
    empty = {i for i in optional if rows and all(row[i] == "-" for row in rows)}
    keep = [i for i in range(len(header)) if i not in empty]
    return ([header[i] for i in keep], [[row[i] for i in keep] for row in rows],
            {keep.index(i) for i in numeric if i in keep})


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """Cells are HTML already (escape before calling)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _links(files: Mapping[str, str], prefix: str | None, word: Callable[[str], str] | None = None) -> str:
    """Relative links to a record's files (repro scripts first), named by the file's name, or by `word(label)` with
    the file's name in the link's title; paths that leave the dump are not linked."""
    items = []
    for label, path in sorted(files.items(), key=lambda item: (not item[0].startswith("repro"), item[0])):
        try:
            safe = layout.safe_relative(path)
        except ValueError:
            items.append(f'<span class="muted">{esc(label)}: path outside the dump, not linked</span>')
            continue
        if prefix is None:
            items.append(f"{esc(label)}: <code>{esc(safe)}</code>")
        else:
            href = prefix + "/".join(quote(part) for part in safe.parts)
            text = esc(safe.name if word is None else word(label))
            title = "" if word is None else f' title="{esc(safe.name)}"'
            items.append(f'<a href="{esc(href)}"{title}>{text}</a>')
    return " · ".join(items)


def _script_word(label: str) -> str:
    """A script's link in the correctness table, by what it runs: "repro_thunder" -> "thunder",
    "repro_mismatch_nvfuser" -> "mismatch, nvfuser"."""
    return label.removeprefix("repro_").replace("mismatch_", "mismatch, ")


def _overview(report: RankRecord) -> str:
    c = digest.counts(report)
    compiled = digest.compiled_ms_per_step(report)
    rows = [[esc(k), str(v)] for k, v in c.items()]
    if compiled is not None:  # not the step: `_step` sets the step's wall time beside it where it was measured
        rows.append(["time in the compiled graphs per step",
                     f"{esc(flagged(ms(compiled, unit=True), digest.compiled_samples_flag(report)))} "
                     f"({esc(digest.clock(report).value)} clock, {esc(digest.steps(report).describe())})"])
    html = _first_step(report) + _step(report) + _table(["", "rank " + str(report.rank)], rows)
    for warning in report.meta.get("environment_warnings", []):
        html += f'<p><span class="flag">environment</span> {esc(warning)}</p>'
    for warning in report.meta.get("warnings", []):
        html += f'<p><span class="flag">warning</span> {esc(warning)}</p>'
    for failure in report.meta.get("reporting_failures", []):
        if isinstance(failure, Mapping):
            html += (f'<p><span class="flag">reporting failure</span> while {esc(failure.get("what"))}: '
                     f'{esc(failure.get("error"))}</p>')
    return html


def _compiles(report: RankRecord) -> str:
    def seconds(value):
        return "-" if value is None else f"{value:.1f} s"

    rows = [[esc(g.name), esc(g.compile_id or "?"), str(g.node_count), str(g.calls), seconds(g.compile_time_s),
             seconds(g.compile_cost.forward_s if g.compile_cost else None),
             seconds(g.compile_cost.backward_s if g.compile_cost else None),
             esc((g.break_reason or "-").strip().splitlines()[0][:200] if (g.break_reason or "").strip() else "-"),
             esc(shortened(g.recompile_reason or "", 300))]
            for g in report.graphs]
    html = "<h3>Compiles</h3>" + _table(
        ["graph", "compile id", "ops", "calls", "backend call", "first forward", "first backward", "graph break",
         "recompile reason"], rows, {2, 3, 4, 5, 6})
    for frame, graphs in digest.recompiled_frames(report).items():
        html += (f"<p>Frame {esc(frame)} was compiled {plural(len(graphs), 'time')}: "
                 f"{esc(', '.join(g.compile_id or '?' for g in graphs))}</p>")
    return html


def _reasons(report: RankRecord) -> str:
    groups = digest.group_reasons(report)
    if not groups:
        return "<h3>Split reasons</h3><p>No split reasons: every op ran under Thunder.</p>"
    chart = bar_chart([Bar(f"{g.type} {g.op}", g.count, g.type) for g in groups], title="split reasons",
                      value_format="{:.0f}", axis_label="split reasons (count)")
    rows = [[esc(g.type), f"<code>{esc(g.op)}</code>", str(g.count), esc(", ".join(sorted(set(g.places)))),
             "<br>".join(esc(e) for e in g.exceptions)] for g in groups]
    return "<h3>Split reasons</h3>" + chart + _table(["type", "op", "count", "where", "exception"], rows, {2})


def _timing_charts(report: RankRecord, sources: provenance.SourceIndex) -> str:
    pieces = digest.timed_pieces(report)
    if not pieces:
        return "<h3>Timing</h3><p>No timing samples in this dump (THUNDERFX_DEBUG_TIMING=off, or too few calls).</p>"
    compiled = digest.compiled_ms_per_step(report)
    kind = digest.clock(report)
    html = (f"<h3>Timing</h3><p>{esc(digest.time_word(kind).capitalize())} time per step: headline median per call x "
            f"calls per step ({esc(kind.value)} clock; each piece's first sampled call and its graph's disturbed "
            "calls are left out of the medians, and pieces with too few samples or much spread are marked).</p>")
    levels = ((PieceLevel.GRAPH, "time per graph"), (PieceLevel.SPLIT, "time per split"),
              (PieceLevel.FUSION, "time per fusion region"))
    for level, title in levels:
        chosen = [p for p in pieces if p.level is level]
        bars = [Bar(f"{p.path} {p.phase}", p.ms_per_step, p.executor if level is not PieceLevel.GRAPH else p.phase,
                    note=f"{100 * p.ms_per_step / compiled:.1f}%" if compiled else "") for p in chosen]
        if bars:
            html += f"<h4>{esc(title.capitalize())}</h4>" + bar_chart(
                bars, unit="ms", title=title, axis_label=f"ms per step (median per call x calls per step, "
                                                          f"{digest.clock(report).value} clock); % of the compiled "
                                                          "graphs' time per step")
    top = digest.top_regions(report, 15)
    if top:
        wall = accounting.wall_step_ms(report)
        rows = [[str(i), esc(p.label) + _from(p.sources, sources, p.reads_saved_from), esc(p.executor),
                 ms(p.headline.median_ms), ms(p.headline.p10_ms), ms(p.headline.p90_ms), ms(p.ms_per_step),
                 "-" if s is None else f"{100 * s:.1f}%",
                 *([f"{100 * p.ms_per_step / wall:.1f}%"] if wall else []), esc(p.headline.flag or "")]
                for i, (p, s) in enumerate(top, 1)]
        whole = f"the compiled graphs' {ms(compiled)} ms per step" if compiled else "the compiled graphs' time per step"
        html += (f"<h4>Top regions by {esc(digest.time_word(kind))} time</h4><p>Shares of {esc(whole)}"
                 + (f" and of the {ms(wall)} ms wall-clock step (which also holds eager code, the optimizer and "
                    "data loading)" if wall else "") + ".</p>") + _table(
            ["#", "region", "executor", "median ms", "p10", "p90", "ms per step", "share of compiled",
             *(["share of wall step"] if wall else []), "note"], rows, {0, 3, 4, 5, 6, 7, 8} if wall else {0, 3, 4, 5, 6, 7})
    series = [Series(f"{p.path} {p.phase}", tuple(zip(p.timing.calls or range(1, p.timing.count + 1),
                                                         p.timing.samples_ms)))
              for p in pieces if p.level is PieceLevel.GRAPH]
    html += "<h4>Samples over the run</h4>" + timeline(
        series, x_label="call of the graph (sampled calls only)", y_label=f"ms ({digest.clock(report).value} clock)",
        title="timeline of samples")
    if any(not p.timing.complete for p in pieces):
        html += ('<p class="muted">A long run keeps some of its samples raw: its first ones, a uniform sample of all '
                 "of them and its most recent ones; counts, means and extremes cover every sample.</p>")
    html += _time_over_the_run(pieces, digest.clock(report))
    return html


#: Graph phases drawn in "Time over the run" (one small chart each, the costliest first).
TIME_OVER_THE_RUN_CHARTS = 4


def _time_over_the_run(pieces: list[digest.TimedPiece], clock: ClockKind | None) -> str:
    """The graphs' time series, one small chart per graph and phase (so that lines do not hide each other): median
    and p90 per window of consecutive samples, at the window's middle call; the axis follows the median, a p90 far
    above it is marked at the top edge with its value."""
    chosen = sorted((p for p in pieces if p.level is PieceLevel.GRAPH and len(p.timing.windows) >= 2),
                    key=lambda p: -p.ms_per_step)
    if not chosen:
        return ""
    html = ("<h4>Time over the run</h4><p>Median and 90th percentile of each window of consecutive samples "
            "(estimated from a sample of the window where it holds many), at the window's middle call"
            + (f"; the {TIME_OVER_THE_RUN_CHARTS} costliest of {len(chosen)} graph phases" if len(chosen)
               > TIME_OVER_THE_RUN_CHARTS else "") + ".</p>")
    for p in chosen[:TIME_OVER_THE_RUN_CHARTS]:
        middle = [(w.first_call + w.last_call) / 2 for w in p.timing.windows]
        series = [Series("median", tuple(zip(middle, (w.median_ms for w in p.timing.windows))))]
        if any(w.p90_ms != w.median_ms for w in p.timing.windows):  # windows of one sample: p90 is the median
            series.append(Series("p90", tuple(zip(middle, (w.p90_ms for w in p.timing.windows)))))
        html += f"<h5>{esc(p.path)} {esc(p.phase)}</h5>" + timeline(
            series, x_label="call of the graph (middle of the window)",
            y_label=f"ms ({clock.value if clock else '?'} clock)", title=f"{p.path} {p.phase} over the run",
            axis_from=("median",))
    return html


def _from(pieces_sources: tuple[str, ...], sources: provenance.SourceIndex,
          reads_saved_from: tuple[str, ...] = ()) -> str:
    """A piece's source lines under its name in a table cell, and those that made the saved values it reads, linked
    to their code (nothing for a piece without)."""
    html = f'<br><span class="muted">from {sources.links(pieces_sources)}</span>' if pieces_sources else ""
    if reads_saved_from:
        html += f'<br><span class="muted">{esc(READS_SAVED)} {sources.links(reads_saved_from)}</span>'
    return html


def _graph(graph: GraphRecord, prefix: str | None, sources: provenance.SourceIndex) -> str:
    html = f'<h3 id="{esc(graph.name)}">{esc(graph.name)} <span class="muted">compile id {esc(graph.compile_id or "?")}</span></h3>'
    if graph.error:
        html += f'<p><span class="flag">error</span></p><pre>{esc(graph.error)}</pre>'
    if graph.files:
        html += f"<p>Scripts: {_links(graph.files, prefix)}</p>"
    passed_over = digest.timing_passed_over(graph)
    if passed_over:
        html += f'<p class="muted">{esc(passed_over)}</p>'
    rows = []
    left_out = left_out_calls(graph)
    for s in graph.splits:
        reasons = "<br>".join(esc(f"{r.type} {digest.reason_op(r)}") for r in s.reasons)
        cost = s.compile_cost
        first = "-" if cost is None else esc(", ".join(
            f"{p.when.value} {p.what.value} {p.seconds:.2f} s" for p in cost.parts if p.seconds >= 0.005))
        rows.append([esc(s.name) + _from(s.sources, sources), esc(s.kind.value), str(len(s.ops)),
                     str(len(s.fusions)), ms(_median(s.timing, left_out)), ms(_median(s.backward_timing, left_out)),
                     ms(_median(s.host_timing, left_out)), ms(_median(s.host_backward_timing, left_out)), first,
                     reasons, _links(s.files, prefix)])
    html += _table(*_without_empty(["split", "kind", "ops", "fusions", "fwd median ms", "bwd median ms",
                                    "fwd host wall", "bwd host wall", "first call", "split reasons", "files"], rows,
                                   {2, 3, 4, 5, 6, 7}, optional={6, 7}))
    for s in graph.splits:
        if s.kind is not SplitKind.THUNDER:
            continue
        html += f"<details><summary>{esc(s.name)}: {plural(len(s.fusions), 'fusion region')}, traces</summary>"
        frows = [[esc(f.name) + _from(f.sources, sources, f.reads_saved_from), esc(f.phase.value), esc(f.executor),
                  str(len(f.ops)), ms(_median(f.timing)),
                  f"<details><summary>ops</summary><code>{esc(' '.join(f.ops))}</code></details>",
                  _links(f.files, prefix)] for f in s.fusions]
        html += _table(["region", "phase", "executor", "ops", "median ms", "fused ops", "repro"], frows, {3, 4})
        html += _parts(graph, s)
        for label, text in (("forward trace", s.fwd_trace), ("backward trace", s.bwd_trace)):
            if text:
                cut = "" if len(text) <= MAX_TRACE_CHARS else "\n# ... cut here; the whole trace is in the dump"
                html += (f"<details><summary>{label} of {esc(s.name)}</summary>"
                         f"<pre>{esc(text[:MAX_TRACE_CHARS])}{esc(cut)}</pre></details>")
        if s.error:
            html += f"<pre>{esc(s.error)}</pre>"
        html += "</details>"
    return html


def _parts(graph: GraphRecord, split) -> str:
    """A thunder split's time, region by region and op group by op group, per phase (`accounting.split_parts`)."""
    html = ""
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        total, parts = accounting.split_parts(graph, split, phase)
        if total is None or len(parts) < 2:
            continue
        whole = _median(total, left_out_calls(graph)) or 0.0
        share = accounting.accounted_share(total, parts, graph)
        rows = [[esc(p.label), esc(p.executor), str(p.count or ""), ms(p.median_ms),
                 f"{100 * p.median_ms / whole:.1f}%" if whole else "-", esc(p.headline.flag or "")] for p in parts]
        html += (f"<p>{esc(split.name)} {phase.value}: {whole:.3f} ms ({esc(digest.time_word(total.clock))} time), "
                 + (f"its parts add up to {100 * share:.0f}% of it" if share is not None else "")
                 + " (headline medians; an op's time runs to the next op, with the views and dels after it)</p>"
                 + _table(["part", "executor", "ops", "median ms", "share", "note"], rows, {2, 3, 4}))
    return html


#: The correctness headline's badge by `correctness.verdict`: an alarm only where a piece mismatched.
VERDICT_BADGES = {"mismatch": "flag", "uncompared": "neutral", "clean": "calm"}

#: A checked piece's badge in the correctness table, by its status.
_ROW_BADGES = {"mismatch": ("flag", "MISMATCH"), "failed": ("neutral", "check failed"),
               "not compared": ("neutral", "not compared"), "partly compared": ("neutral", "partly compared"),
               "clean": ("calm", "ok")}


def _correctness(report: RankRecord, prefix: str | None) -> str:
    """The headline, coloured by its verdict, then one row per checked piece in a table that fits a laptop's
    width: the worst value against its tolerance and the script that runs the piece as the check did; what a row
    cannot hold (why values were not compared, which others mismatched) on a full-width line under it."""
    pieces = correctness.checked_pieces(report)
    if not pieces:
        return ""
    line = correctness.headline(pieces).split(": ", 1)[1]
    verdict = correctness.verdict(pieces)
    html = ("<h3>Correctness</h3><p>Thunder against eager on checked calls (THUNDERFX_DEBUG_CHECK): "
            f'<span class="{VERDICT_BADGES[verdict]} verdict" data-verdict="{verdict}">{esc(line)}</span></p>')
    order = {"mismatch": 0, "failed": 1, "not compared": 2, "partly compared": 3, "clean": 4}
    with_scripts = any(p.scripts for p in pieces)
    header = ["", "piece", "mismatching / checked calls", "worst value", "at call", "error (abs / rel)", "allowed",
              "against", "x tolerance", *(["script"] if with_scripts else [])]
    numeric = {2, 4, 5, 6, 8}
    body = []
    for p in sorted(pieces, key=lambda p: order[p.status]):  # report order within a status
        c = p.check or Check()
        badge, word = _ROW_BADGES[p.status]
        verdict_cell = f'<span class="{badge}">{esc(word)}</span>'
        if c.writes_unowned_memory:
            verdict_cell += ' <span class="flag">writes memory it does not own</span>'
        error = "-" if c.worst_abs_error is None else f"{_number(c.worst_abs_error)} / {_number(c.worst_rel_error)}"
        cells = [verdict_cell, esc(p.path), f"{c.mismatches} / {c.calls}", esc(c.worst_output or "-"),
                 esc(str(c.worst_call or "-")), error, _number(c.allowed), esc(c.reference or "-"),
                 _number(c.worst_ratio), *([_links(p.scripts, prefix, _script_word)] if with_scripts else [])]
        body.append("<tr>" + "".join(f'<td class="num">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
                                     for i, cell in enumerate(cells)) + "</tr>")
        said = correctness.note(p)
        if said:
            body.append(f'<tr class="note"><td></td><td colspan="{len(header) - 1}">{esc(said)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in header)
    return html + f'<table class="checks"><tr>{head}</tr>{"".join(body)}</table>'


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def rank_section(report: RankRecord, prefix: str | None) -> str:
    """Everything about one rank; `prefix` is the relative URL of its rank dir from the page (None: no links)."""
    sources = provenance.SourceIndex(report)
    parts = [f'<section id="rank{report.rank}"><h2>Rank {report.rank}</h2>',
             failures.html_section(report, lambda path: _links({"script": path}, prefix)), _overview(report),
             _correctness(report, prefix),
             minimized.html_section(report, lambda path: _links({"minimal script": path}, prefix)),
             _compiles(report), _reasons(report), _timing_charts(report, sources),
             triage_findings.html_section(report), memory.html_section(report), "<h3>Graphs</h3>"]
    parts += [_graph(g, prefix, sources) for g in report.graphs]
    parts += [provenance.html_section(report, sources), "</section>"]
    return "".join(parts)


def _ranks_compared(reports: Mapping[int, RankRecord]) -> str:
    from thunderfx_debug.render.diff import diff_reports, render_structure_changes

    rows_by_rank = digest.compare_ranks(reports)
    keys = list(rows_by_rank[0].counts)
    rows = []
    for row in rows_by_rank:
        flags = " ".join(f'<span class="flag">{f}</span>' for f, on in
                         (("straggler", row.straggler), ("splits differently", row.splits_differently)) if on)
        rows.append([f'<a href="#rank{row.rank}">rank {row.rank}</a>', *(str(row.counts[k]) for k in keys),
                     ms(row.compiled_ms), flags])
    html = "<h2>Ranks side by side</h2>" + _table(["rank", *map(esc, keys), "compiled ms per step", ""], rows,
                                                   set(range(1, len(keys) + 2)))
    html += "<h4>Time in the compiled graphs per step, per rank</h4>"
    html += bar_chart([Bar(f"rank {r.rank}", r.compiled_ms or 0.0, "straggler" if r.straggler else "thunderfx")
                       for r in rows_by_rank], unit="ms", title="time in the compiled graphs per step, per rank",
                      axis_label="ms in the compiled graphs per step")
    per_call: dict[int, dict[int, float]] = {}
    for rank, report in reports.items():
        totals: dict[int, float] = defaultdict(float)
        for p in digest.timed_pieces(report):
            if p.level is PieceLevel.GRAPH:
                for call, sample_ms in zip(p.timing.calls, p.timing.samples_ms):
                    totals[call] += sample_ms
        per_call[rank] = totals
    html += "<h4>Sampled calls per rank (graphs' forward + backward)</h4>" + timeline(
        [Series(f"rank {rank}", tuple(sorted(t.items()))) for rank, t in per_call.items()],
        x_label="call of the graphs (sampled calls only)", y_label="ms, graphs' forward + backward",
        title="time of the sampled calls per rank")
    html += _straggler_view(reports)
    base_rank, base = next(iter(reports.items()))
    for rank, report in reports.items():
        if rank != base_rank and digest.structure(report) != digest.structure(base):
            changes = render_structure_changes(diff_reports(base, report))
            html += (f"<h4>Rank {rank} against rank {base_rank}</h4><ul>"
                     + "".join(f"<li>{esc(c)}</li>" for c in changes) + "</ul>")
    return html


def render_html(reports: Mapping[int, RankRecord], link_prefixes: Mapping[int, str] | None = None,
                title: str = "ThunderFX report") -> str:
    """The page for the ranks of a dump.

    Args:
        reports: rank -> RankRecord (`dump.load_reports(dir)`).
        link_prefixes: rank -> relative URL of that rank's directory seen from where the page is written
            (e.g. "rank0/"); ranks without one get no links, only the file names.
        title: the page title (escaped).
    """
    link_prefixes = link_prefixes or {}
    body = [f"<h1>{esc(title)}</h1>"]
    failed = [(rank, graph.failure) for rank, report in reports.items() for graph in failures.failed_graphs(report)]
    if failed:  # the first lines of the page: each rank's section says more
        body.append("".join(f'<p><span class="flag">FAILED</span> <a href="#rank{rank}">rank {rank}</a>: '
                            f"{esc(failures.headline(failure))}</p>" for rank, failure in failed))
    if len(reports) > 1:
        body.append(_ranks_compared(reports))
    body += [rank_section(report, link_prefixes.get(rank)) for rank, report in reports.items()]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>" + "".join(body) + "</body></html>\n"
    )


def _straggler_view(reports: Mapping[int, RankRecord]) -> str:
    """The ranks' steps, their spread, the slowest rank's costliest pieces on every rank, the collectives (see
    `render.ranks`)."""
    from thunderfx_debug.render import ranks

    steps = ranks.rank_steps(reports)
    clock = next((s.clock for s in steps if s.clock is not None), None)
    if clock is None:
        html = "<h3>The straggler view</h3><p>No rank timed its graphs.</p>"
    else:
        html = (f"<h3>The straggler view</h3><p>Compiled time per step: the graphs' forward and backward, median "
                f"per call x calls per step ({esc(ranks.clock_words(clock))}).</p>")
        html += _table(["rank", "compiled step ms", "collectives in graphs ms", "step wall time ms (host clock)"],
                       [[str(s.rank), ms(s.compiled_ms), ms(s.collective_ms), ms(s.wall_ms)] for s in steps],
                       {1, 2, 3})
    spread = ranks.spread(steps)
    if spread is not None:
        html += (f"<p>Rank {spread.slowest} slowest ({spread.slowest_ms:.3f} ms), rank {spread.fastest} fastest "
                 f"({spread.fastest_ms:.3f} ms): {spread.ratio:.2f}x; rank {spread.slowest} is "
                 f"{spread.excess_ms:.3f} ms per step above the median of the others.</p>")
        pieces = ranks.slowest_pieces(reports, spread.slowest)
        if pieces:
            rows = [[esc(p.label), esc(p.executor),
                     *(ms(p.ms_per_step[r]) if p.ms_per_step[r] is not None else "absent" for r in reports),
                     "-" if p.excess_ms is None else f"{p.excess_ms:+.3f}"] for p in pieces]
            html += (f"<h4>Rank {spread.slowest}'s costliest pieces on every rank (ms per step)</h4>"
                     + _table(["piece", "executor", *(f"rank {r}" for r in reports), f"rank {spread.slowest} - others"],
                              rows, set(range(2, len(reports) + 3))))
    places = [(rank, place) for rank, report in reports.items() for place in ranks.collective_places(report)]
    if places:
        html += "<h4>Collectives inside the graphs</h4>" + _table(
            ["rank", "where", "kind", "ops"],
            [[str(r), esc(p.place), esc(p.kind), f"<code>{esc(', '.join(p.ops))}</code>"] for r, p in places])
    for rank, by_compile in ranks.ddp_buckets(next(iter(reports.values()))).items():
        html += (f"<p>DDP: DDP's optimizer split compile {esc(rank)} into {plural(len(by_compile), 'graph')}, one "
                 f"per gradient bucket ({esc(', '.join(by_compile))}).</p>")
    lags = ranks.arrival_lags(reports)
    if lags is not None:
        clocks = "one host's clock" if lags.same_host else "the hosts' clocks, which may be offset"
        html += (f"<h4>Collectives outside the graphs (torch's flight recorder)</h4><p>{lags.matched} collectives "
                 f"found on every rank, over {lags.span_s:.1f} s; when each rank enqueued them ({clocks}). A "
                 "collective completes once its last rank has enqueued it: the others wait about its lag.</p>")
        html += _table(["rank", "enqueued last", "median lag behind the first ms", "total lag ms"],
                       [[str(r), f"{lags.last[r]} of {lags.matched}", ms(lags.median_lag_ms[r]),
                         ms(lags.total_lag_ms[r])] for r in lags.last], {1, 2, 3})
        elsewhere = ranks.late_outside_graphs(steps, lags)
        if elsewhere is not None:
            html += f"<p><b>{esc(elsewhere[0].upper() + elsewhere[1:])}.</b></p>"
    times = ranks.collective_times(reports)
    if times:
        html += "<p>Device time of the collectives where c10d timed them (median ms per call x count = total):</p>"
        html += _table(["collective", *(f"rank {r}" for r in reports)], [
            [esc(row.name), *(f"{ms(row.by_rank[r][1])} x{row.by_rank[r][0]} = {ms(row.by_rank[r][2])}"
                              if r in row.by_rank else "-" for r in reports)] for row in times],
            set(range(1, len(reports) + 1)))
    html += "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in ranks.outside_graphs_note(reports)) + "</ul>"
    return html
