"""Rendering from checked-in dump fixtures (tests/fixtures, made by make_fixtures.py from real CPU runs): summary
facts, multi-rank comparison, diff with its noise test, HTML escaping, and the bench triage logic. No thunder
compile here: these read dumps only, as on a laptop."""

from __future__ import annotations

import dataclasses
import html
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from thunderfx_debug.commands import bench
from thunderfx_debug.dump.files import load_report, load_reports
from thunderfx_debug.records import Check, Phase, SplitKind, Timing
from thunderfx_debug.render.report import Report
from thunderfx_debug.render import digest, svg
from thunderfx_debug.render.diff import diff_reports, render_diff
from thunderfx_debug.render.headline import headline, left_out_calls
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_ranks, render_summary
from thunderfx_debug.commands.bench_report import render_bench_report
from conftest import dump_fixtures

FIXTURES = dump_fixtures()
NORMAL = FIXTURES / "normal"
TWO_RANK = FIXTURES / "two_rank"


@pytest.fixture(scope="module")
def normal() -> Report:
    return load_report(NORMAL)


@pytest.fixture(scope="module")
def ranks() -> dict[int, Report]:
    return load_reports(TWO_RANK)


def scaled(timing: Timing | None, factor: float) -> Timing | None:
    return None if timing is None else dataclasses.replace(timing, samples_ms=tuple(s * factor for s in timing.samples_ms))


def with_split_timing(report: Report, graph: str, split: str, factor: float) -> Report:
    """`report` with one split's forward samples multiplied by `factor`."""
    graphs = []
    for g in report.graphs:
        if g.name == graph:
            splits = tuple(dataclasses.replace(s, timing=scaled(s.timing, factor)) if s.name == split else s
                           for s in g.splits)
            g = dataclasses.replace(g, splits=splits)
        graphs.append(g)
    return dataclasses.replace(report, graphs=tuple(graphs))


def without_fusion_timing(report: Report) -> Report:
    """`report` as a dump recorded with THUNDERFX_DEBUG_TIMING=split has it: no fusion or outside-fusion timing."""
    graphs = []
    for g in report.graphs:
        splits = tuple(dataclasses.replace(s, outside_fusions_timing={},
                                           fusions=tuple(dataclasses.replace(f, timing=None) for f in s.fusions))
                       for s in g.splits)
        graphs.append(dataclasses.replace(g, splits=splits))
    return dataclasses.replace(report, graphs=tuple(graphs))


# ---- summary facts ----------------------------------------------------------------------------------------------


def test_fixture_is_a_real_run_with_timing(normal):
    assert [g.name for g in normal.graphs] == ["graph0", "graph1"]
    assert all(g.calls == 12 and g.timing is not None and g.timing.count > 1 for g in normal.graphs)
    inductor = [s for g in normal.graphs for s in g.splits if s.kind is SplitKind.INDUCTOR]
    assert inductor and all(s.reasons for s in inductor)
    assert any(s.fwd_trace for g in normal.graphs for s in g.splits)


def test_counts_match_the_records(normal):
    c = digest.counts(normal)
    splits = [s for g in normal.graphs for s in g.splits]
    assert c["graphs"] == len(normal.graphs)
    assert c["thunder splits"] + c["inductor splits"] == len(splits)
    assert c["forward fusions"] + c["backward fusions"] == sum(len(s.fusions) for s in splits)
    assert c["split reasons"] == sum(len(s.reasons) for s in splits)
    assert c["recompiles"] == 0


def test_split_reasons_grouped_by_type_and_op(normal):
    groups = digest.group_reasons(normal)
    sinc = [g for g in groups if g.op == "torch.sinc"]
    assert len(sinc) == 1 and sinc[0].type == "MISSING_OP_SUPPORT"
    assert sinc[0].count == sum(1 for g in normal.graphs for s in g.splits for r in s.reasons if r.op == "torch.sinc")
    assert all(place.startswith("graph0/inductor_") for place in sinc[0].places)
    # Grouping a reason list duplicated three times triples the counts and keeps the groups.
    tripled = dataclasses.replace(normal.graphs[0], unattributed_reasons=normal.graphs[0].reasons * 2)
    assert [g.count for g in digest.group_reasons([tripled])] == [3 * g.count for g in digest.group_reasons([normal.graphs[0]])]


def test_recompiles_are_found_by_frame(normal):
    g0 = normal.graphs[0]
    recompiled = dataclasses.replace(g0, name="graph2", index=2, compile_id=g0.compile_id.split("/")[0] + "/1",
                                     recompile_reason="tensor 'x' size mismatch at index 0")
    report = dataclasses.replace(normal, graphs=normal.graphs + (recompiled,))
    frames = digest.recompiled_frames(report)
    assert list(frames) == [g0.compile_id.split("/")[0]]
    assert [g.name for g in next(iter(frames.values()))] == ["graph0", "graph2"]
    assert digest.counts(report)["recompiles"] == 1
    assert "tensor 'x' size mismatch" in render_summary(report)


def test_a_long_recompile_reason_is_whole_in_its_graph_and_cut_between_words_elsewhere(normal):
    """Dynamo's guard text with the source line it came from runs past 200 characters: the graph's section says it
    whole, the overview and the page cut it at a space and say so, never inside a word."""
    g0 = normal.graphs[0]
    reason = ("0/0: rare == False  # if rare:   # a branch decided by the loop: Dynamo compiles this frame again  "
              "# models/branchy_decoder_with_a_long_name.py:12 in forward  " * 3).strip()
    recompiled = dataclasses.replace(g0, name="graph2", index=2, compile_id=g0.compile_id.split("/")[0] + "/1",
                                     recompile_reason=reason)
    report = dataclasses.replace(normal, graphs=normal.graphs + (recompiled,))
    summary = render_summary(report)
    assert f"  recompiled because: {reason}" in summary
    overview = next(line for line in summary.splitlines() if line.startswith(f"    {recompiled.compile_id}: "))
    shown = overview.removeprefix(f"    {recompiled.compile_id}: ")
    assert shown.endswith(" ... (cut)") and reason.startswith(shown.removesuffix(" ... (cut)"))
    assert reason[len(shown.removesuffix(" ... (cut)"))] == " "  # cut between two words
    page = render_html({0: report})
    cell = re.search(r"<td>(0/0: rare == False[^<]*)</td>", page)[1]
    assert cell.endswith(" ... (cut)") and html.unescape(cell).removesuffix(" ... (cut)") + " " in reason + " "


def test_time_in_the_compiled_graphs_per_step_and_shares(normal):
    steps = digest.steps(normal).count
    assert steps == 12 and not digest.steps(normal).counted  # an older dump: no optimizer steps recorded
    # Headline medians: each piece's first sampled call (and its graph's disturbed calls) left out (see `headline`).
    expected = sum(headline(t, left_out_calls(g)).median_ms * g.calls / steps
                   for g in normal.graphs for t in (g.timing, g.backward_timing) if t)
    assert expected != pytest.approx(sum((t.median_ms or 0) * g.calls / steps for g in normal.graphs
                                         for t in (g.timing, g.backward_timing) if t))  # the rule leaves samples out
    assert digest.compiled_ms_per_step(normal) == pytest.approx(expected)
    top = digest.top_regions(normal, limit=100)
    times = [piece.ms_per_step for piece, _ in top]
    assert times == sorted(times, reverse=True)
    assert all(share == pytest.approx(p.ms_per_step / expected) for p, share in top)


def test_top_regions_are_fusions_where_fusions_are_timed(normal):
    """The fixture was timed at fusion level: Thunder splits are represented by their fusion regions and the time
    outside them, inductor splits (no fusions) by themselves. Without fusion timing, splits are the regions."""
    fusion_timed = sum(1 for g in normal.graphs for s in g.splits for f in s.fusions if f.timing and f.timing.count)
    assert fusion_timed == sum(len(s.fusions) for g in normal.graphs for s in g.splits) > 0
    for report, thunder_levels in ((normal, {"fusion", "outside fusions"}), (without_fusion_timing(normal), {"split"})):
        top = digest.top_regions(report, limit=100)
        levels: dict[tuple[str, str], set[str]] = {}
        for p, _ in top:
            levels.setdefault((p.graph, p.split), set()).add(p.level)
        for g in report.graphs:
            for s in g.splits:
                expected = thunder_levels if s.kind is SplitKind.THUNDER else {"split"}
                assert levels.get((g.name, s.name)) == expected, (g.name, s.name)
    names = [p.name for p, _ in digest.top_regions(normal, limit=100) if p.level == "fusion"]
    assert sorted(names) == sorted(f.name for g in normal.graphs for s in g.splits for f in s.fusions)


def test_summary_renders_every_graph_and_split(normal):
    text = render_summary(normal)
    assert str(normal) == text
    for g in normal.graphs:
        assert g.name in text and (g.compile_id or "") in text
        for s in g.splits:
            assert s.name in text


# ---- ranks ------------------------------------------------------------------------------------------------------


def test_two_rank_fixture_flags_the_rank_that_differs(ranks):
    assert sorted(ranks) == [0, 1]
    rows = {row.rank: row for row in digest.compare_ranks(ranks)}
    assert not rows[0].splits_differently and rows[1].splits_differently
    assert rows[1].counts["inductor splits"] < rows[0].counts["inductor splits"]
    # The fixture's rank 1 trained with a thread competing for the GIL: it is the straggler.
    assert rows[1].compiled_ms > rows[0].compiled_ms
    assert rows[1].straggler and not rows[0].straggler
    text = render_ranks(ranks)
    assert "rank 1 against rank 0" in text and "graph0/inductor_1" in text


def test_straggler_needs_more_than_ten_percent(ranks):
    base = ranks[0]
    slightly = {0: base, 1: dataclasses.replace(base, meta={**base.meta, "rank": 1}), 2: base}
    assert not any(r.straggler or r.splits_differently for r in digest.compare_ranks(slightly))
    slow = with_split_timing(base, "graph0", "thunder_0", 1.0)
    slow = dataclasses.replace(slow, graphs=tuple(
        dataclasses.replace(g, timing=scaled(g.timing, 3.0)) for g in slow.graphs))
    rows = digest.compare_ranks({0: base, 1: slow, 2: base})
    assert [r.straggler for r in rows] == [False, True, False]


def test_the_correctness_tables_text_breaks_anywhere_and_its_numbers_nowhere(normal):
    """What lets a long parameter name break inside the table's width (`overflow-wrap: anywhere` counts in a table's
    column widths, `break-word` does not) and keeps each number on one line; measured in a browser at a laptop's
    width by tests/test_html_browser.py."""
    style = render_html({0: normal}).split("<style>", 1)[1].split("</style>", 1)[0]
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", style.replace("\n", "")))
    assert "overflow-wrap:anywhere" in rules["table.checks td"]
    assert "white-space:nowrap" in rules["table.checks td.num"]


# ---- diff -------------------------------------------------------------------------------------------------------


def test_diff_of_a_run_with_itself_is_empty_and_says_both_are_one_dump(normal, ranks):
    d = diff_reports(normal, normal)
    assert not d.structure_changed and not d.significant_timings
    assert all(t.change.ratio == pytest.approx(1.0) for t in d.timings)
    text = render_diff(d, "dump", "dump")
    assert text.splitlines()[2].startswith(f"A and B are the same dump (run {normal.meta['run_id']}, rank 0, written "
                                          "at ")
    # Another flush of the same process, or another rank of the run, is another dump.
    later = dataclasses.replace(normal, meta={**normal.meta, "written_at": "2026-01-01T00:10:00+00:00"})
    assert diff_reports(normal, later).same_dump is None and diff_reports(normal, ranks[1]).same_dump is None
    assert "same dump" not in render_diff(diff_reports(normal, later))


def test_diff_finds_structural_changes(normal, ranks):
    d = diff_reports(normal, ranks[1])  # rank 1: no graph break, no torch.sinc
    assert d.graphs_removed == ["graph1"]
    assert set(d.splits_removed) == {"graph0/inductor_1", "graph0/thunder_2"}
    assert ("MISSING_OP_SUPPORT", "torch.sinc") in {(t, op) for t, op, a, b in d.reasons if b == 0}
    changed = {(f.split, f.name, f.phase) for f in d.fusions if f.status == "changed"}
    assert ("graph0/thunder_0", "TorchCompile0", "forward") in changed
    forward = next(f for f in d.fusions if f.name == "TorchCompile0" and f.phase == "forward")
    assert forward.ops_added  # the whole model is one split now: more ops in its fusion
    reverse = diff_reports(ranks[1], normal)
    assert reverse.graphs_added == ["graph1"] and set(reverse.splits_added) == set(d.splits_removed)


def test_diff_flags_a_slowdown_beyond_noise_only(normal):
    rng = random.Random(0)
    samples = tuple(1.0 + 0.05 * rng.random() for _ in range(30))
    base = dataclasses.replace(normal.graphs[0].splits[0].timing, samples_ms=samples, calls=tuple(range(30)))
    graph = dataclasses.replace(normal.graphs[0], splits=(dataclasses.replace(normal.graphs[0].splits[0], timing=base),))
    a = dataclasses.replace(normal, graphs=(graph,))
    for factor, expected in ((1.5, "slower"), (0.7, "faster"), (1.005, "within noise")):
        b = with_split_timing(a, "graph0", graph.splits[0].name, factor)
        change = next(t for t in diff_reports(a, b).timings if t.level == "split" and t.phase == "forward").change
        assert change.verdict == expected, (factor, change)
        assert change.ratio == pytest.approx(factor)
    # Same distribution, different draws: not flagged.
    other = dataclasses.replace(base, samples_ms=tuple(1.0 + 0.05 * rng.random() for _ in range(30)))
    b = dataclasses.replace(a, graphs=(dataclasses.replace(graph, splits=(dataclasses.replace(graph.splits[0], timing=other),)),))
    assert not diff_reports(a, b).significant_timings
    assert "no piece changed beyond noise" in render_diff(diff_reports(a, b))


# ---- HTML -------------------------------------------------------------------------------------------------------


def test_html_has_charts_traces_and_links(normal):
    page = render_html({0: normal}, {0: "rank0/"})
    assert page.count("<svg") >= 4  # split reasons, time per graph, time per split, timeline
    for g in normal.graphs:
        assert f'id="{g.name}"' in page
    trace = next(s.fwd_trace for g in normal.graphs for s in g.splits if s.fwd_trace)
    assert html.escape(trace.splitlines()[-1]) in page  # the traces are in, escaped
    for g in normal.graphs:
        for s in g.splits:
            for path in s.files.values():
                assert f'href="rank0/{path}"' in page
    assert "<script" not in page.lower() and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def hostile_dump(tmp_path: Path) -> Path:
    """A copy of the normal fixture whose strings try to inject markup and whose file paths try to leave it."""
    root = tmp_path / "hostile"
    shutil.copytree(NORMAL, root)
    graph_json = root / "rank0" / "graph0" / "graph.json"
    data = json.loads(graph_json.read_text())
    data["break_reason"] = '"><img src=x onerror=alert(1)>'
    inductor = next(s for s in data["splits"] if s["kind"] == "inductor")
    inductor["reasons"][0].update(op="<script>alert('op')</script>", exception="</pre><script>alert(2)</script>")
    thunder = next(s for s in data["splits"] if s["kind"] == "thunder")
    thunder["files"]["repro_evil"] = "javascript:alert(3)"
    thunder["files"]["repro_up"] = "x/../../../etc/passwd"
    thunder["fusions"][0]["ops"].append("<svg onload=alert(4)>")
    hostile_line = '/m/"><script>alert(7)</script>.py:3 f'
    thunder["fusions"][0]["sources"] = [hostile_line]
    data["source_excerpts"][hostile_line] = {"first_line": 1, "lines": ["a = 1", "</pre><script>alert(8)</script>"]}
    graph_json.write_text(json.dumps(data))
    trace = root / "rank0" / thunder["files"]["fwd_trace"]
    trace.write_text(trace.read_text() + "\n# </pre><script>alert(5)</script>\n")
    return root


def test_html_escapes_everything_from_the_dump(tmp_path):
    report = load_report(hostile_dump(tmp_path))
    page = render_html({0: report}, {0: "rank0/"}, title="<script>alert(6)</script>")
    lowered = page.lower()
    assert "<script" not in lowered and "<img" not in lowered and "onload=alert" not in lowered.replace("onload=alert(4)&gt;", "")
    assert "javascript:" not in lowered.replace("javascript:alert(3)", "") and 'href="javascript' not in lowered
    hrefs = re.findall(r'href="([^"]*)"', page)
    in_page = [h for h in hrefs if re.fullmatch(r"#rank0-src-\d+", h)]  # a piece's lines, linked to their code
    assert in_page and all(h.startswith("rank0/") and ".." not in h and ":" not in h for h in hrefs if h not in in_page)
    assert "&lt;script&gt;alert(&#x27;op&#x27;)&lt;/script&gt;" in page  # shown, escaped
    # Only the <svg> elements the renderer draws are real tags.
    assert len(re.findall(r"<svg[\s>]", page)) == page.count('<svg xmlns="http://www.w3.org/2000/svg"')


RANDOM = "forward outputs [0] depend on random ops (dropout), which Thunder and eager draw differently"


def with_checks(report: Report, checks: dict[str, Check], drop_scripts: bool = False) -> Report:
    """`report` with these checks on its Thunder splits ("graph0/thunder_0" -> Check; the others clean), and without
    their repro scripts where asked."""
    graphs = []
    for g in report.graphs:
        splits = []
        for s in g.splits:
            if s.kind is SplitKind.THUNDER:
                files = {k: v for k, v in s.files.items() if not k.startswith("repro_")} if drop_scripts else s.files
                s = dataclasses.replace(s, check=checks.get(f"{g.name}/{s.name}", Check(calls=2, compared=4)),
                                        files=files)
            splits.append(s)
        graphs.append(dataclasses.replace(g, splits=tuple(splits)))
    return dataclasses.replace(report, graphs=tuple(graphs))


def correctness_section(page: str) -> str:
    return page[page.index("<h3>Correctness</h3>"):page.index("<h3>Compiles</h3>")]


def test_the_correctness_headline_is_an_alarm_only_where_a_piece_mismatched(normal):
    """The badge follows the verdict: every piece compared clean is calm, pieces not compared (and no mismatch) are
    neutral with their count, a mismatch is the alarm; the table's rows say the same piece by piece."""
    mismatch = Check(calls=2, mismatches=1, compared=4, first_mismatch_call=2, worst_output="forward output 0",
                     worst_call=2, worst_abs_error=0.5, worst_rel_error=0.1, worst_ratio=40.0, rtol=1e-5, atol=1e-5,
                     allowed=0.0125, reference="eager")
    random = Check(calls=2, compared=0, skipped=(RANDOM,))
    badges = {}
    for name, checks in (("clean", {}), ("uncompared", {"graph0/thunder_2": random}),
                         ("mismatch", {"graph0/thunder_2": random, "graph1/thunder_0": mismatch})):
        section = correctness_section(render_html({0: with_checks(normal, checks)}, {0: "rank0/"}))
        (badge,) = re.findall(r'<span class="(\w+) verdict" data-verdict="(\w+)">([^<]*)</span>', section)
        badges[name] = badge
        rows = re.findall(r'<tr><td><span class="(\w+)">([^<]*)</span>', section)
        assert len(rows) == 3  # the three Thunder splits of the fixture
        assert all(cls == "flag" for cls, word in rows if word == "MISMATCH")
        assert {word for _, word in rows} == {"ok"} | {"not compared" for c in checks.values() if c is random} | {
            "MISMATCH" for c in checks.values() if c is mismatch}
    assert [badges[n][:2] for n in badges] == [("calm", "clean"), ("neutral", "uncompared"), ("flag", "mismatch")]
    assert badges["clean"][2] == "no mismatch in 3 compared pieces"
    assert "1 of 3 pieces not compared (1 random numbers)" in badges["uncompared"][2]
    assert badges["mismatch"][2].startswith("1 of 3 pieces MISMATCH")


def test_why_a_piece_was_not_compared_is_a_full_width_line_under_its_row(normal):
    section = correctness_section(render_html({0: with_checks(normal, {
        "graph0/thunder_2": Check(calls=2, compared=0, skipped=(RANDOM,)),
        "graph1/thunder_0": Check(calls=2, compared=3, skipped=("the gradients of 1 inputs depend on random ops",))})},
        {0: "rank0/"}))
    rows = re.findall(r"<tr[^>]*>.*?</tr>", section)
    header, *body = rows
    columns = header.count("<th>")
    assert columns <= 10 and "not compared" not in header  # no column of explanations
    notes = [(i, r) for i, r in enumerate(body) if r.startswith('<tr class="note">')]
    assert [re.search(r'colspan="(\d+)"', r).group(1) for _, r in notes] == [str(columns - 1)] * 2
    # each note sits under the row of its piece, and says what the row cannot
    for i, note in notes:
        piece = re.findall(r"<td>(graph\d/thunder_\d)</td>", body[i - 1])
        assert piece and {"graph0/thunder_2": "not compared: " + RANDOM,
                          "graph1/thunder_0": "partly compared: the gradients of 1 inputs"}[piece[0]] in note
    assert len(body) == 3 + 2  # no note under the piece compared whole and clean


def test_the_script_column_links_each_pieces_script_or_is_left_out(normal, tmp_path):
    report = with_checks(normal, {})
    section = correctness_section(render_html({0: report}, {0: "rank0/"}))
    links = re.findall(r'<a href="([^"]+)" title="([^"]+)">thunder</a>', section)
    splits = [(g, s) for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    assert sorted(href for href, _ in links) == sorted(f"rank0/{s.files['repro_thunder']}" for _, s in splits)
    assert all(href.endswith(title) for href, title in links)
    assert "<th>script</th>" in section
    bare = correctness_section(render_html({0: with_checks(normal, {}, drop_scripts=True)}, {0: "rank0/"}))
    assert "<th>script</th>" not in bare and "<a " not in bare


# ---- charts and wording -----------------------------------------------------------------------------------------


def test_timeline_marks_an_outlier_instead_of_stretching_its_axis():
    steady = tuple((call, 10.0 + 0.1 * (call % 3)) for call in range(1, 13))
    late_compile = ((2, 640.0),)
    page = svg.timeline([svg.Series("graph0 forward", steady + late_compile), svg.Series("graph0 backward", steady)],
                        x_label="call of the graph", y_label="ms (host clock)")
    y_ticks = [float(t) for t in re.findall(r'text-anchor="end">([0-9.]+)</text>', page)]
    assert max(y_ticks) < 20  # the axis fits the steady samples, not the 640 ms one
    (outlier,) = re.findall(r'<g class="outlier">(.*?)</g>', page)
    assert "640.000 ms (host clock) at call of the graph 2" in outlier and ">640<" in outlier
    assert "1 outlier above the axis" in page
    assert page.count('class="axis-label"') == 2 and "call of the graph" in page and "ms (host clock)" in page
    assert page.count('<g class="legend">') == 3  # both series and the outlier mark
    x_ticks = [float(t) for t in re.findall(r'text-anchor="middle">([0-9.]+)</text>', page)]
    assert len(x_ticks) >= 4 and all(t.is_integer() for t in x_ticks)  # calls are whole numbers
    # Without the outlier, nothing is marked.
    assert 'class="outlier"' not in svg.timeline([svg.Series("graph0 forward", steady)])


def test_bar_chart_has_a_value_axis_and_a_legend_that_says_what_the_labels_do_not():
    bars = [svg.Bar("graph0/thunder_0 forward", 12.5, "nvfuser"), svg.Bar("graph0/thunder_2 forward", 20.1, "torch"),
            svg.Bar("graph0/thunder_4 forward", 2.0, "nvfuser")]
    page = svg.bar_chart(bars, unit="ms", axis_label="ms per step")
    assert 'class="axis-label"' in page and ">ms per step<" in page
    legend = re.findall(r'<g class="legend">.*?<text[^>]*>([^<]*)</text></g>', page)
    assert legend == ["nvfuser", "torch"]
    ticks = [float(t) for t in re.findall(r'text-anchor="middle">([0-9.]+)</text>', page)]
    assert ticks[0] == 0 and ticks[-1] >= 20.1
    # Where every label already names its colour's key, or each colour is one bar's own, a legend would only repeat
    # the labels.
    named = svg.bar_chart([svg.Bar("graph0 forward", 12.5, "forward"), svg.Bar("graph1 forward", 2.0, "forward"),
                           svg.Bar("graph0 backward", 20.1, "backward")])
    own = svg.bar_chart([svg.Bar("Thunder tracing", 1.0, "tracing"), svg.Bar("inductor compiling", 2.0, "inductor")])
    assert '<g class="legend">' not in named and '<g class="legend">' not in own


def test_chart_labels_are_broken_between_words_never_inside_one():
    long = "MISSING_OP_SUPPORT EXCEPTION_META_THUNDER torch.nn.functional.scaled_dot_product_attention x2"
    page = svg.bar_chart([svg.Bar(long, 3, "MISSING_OP_SUPPORT"), svg.Bar("short", 1, "other")])
    shown = re.findall(r"<tspan[^>]*>([^<]*)</tspan>", page)
    words = set(re.split(r"[\s_./]+", long)) | {"short"}
    for line in shown:
        pieces = [p for p in re.split(r"[\s_./…]+", line) if p]
        assert all(p in words for p in pieces), (line, shown)  # every piece shown is a whole word of the label
    assert f"<title>{long}: 3.000 </title>" in page  # the whole label in the tooltip


def test_counts_are_worded_in_the_right_number(normal):
    one = dataclasses.replace(normal, graphs=normal.graphs[1:])  # one graph, one split, one call sampled...
    graph = one.graphs[0]
    single = dataclasses.replace(graph, calls=1, timing=dataclasses.replace(graph.timing, samples_ms=(1.0,), calls=(1,)))
    text = render_summary(dataclasses.replace(one, graphs=(single,)))
    assert "1 Dynamo graph," in text and "over 1 sample (" in text and "1 call," in text
    assert re.search(r"\b1 (Dynamo graph|sample|call|thunder split|inductor split|fusion region|op|step)s\b", text) is None
    assert "2 Dynamo graphs," in render_summary(normal)
    assert "ClockKind" not in text  # the clock by its name ("host clock")


# ---- bench triage -----------------------------------------------------------------------------------------------

RESULTS = FIXTURES / "bench_results"


def triage_plan() -> list[bench.Comparison]:
    """The pieces whose results tests/fixtures/bench_results holds (names as the repro writer makes them)."""
    fusion = "graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion{}_{}_repro_{}.py"
    split = "graph0/graph0_thunder_{0}/graph0_thunder_{0}_repro_{1}.py"
    comparisons = [bench.Comparison("split", f"graph0/thunder_{i}", "thunder", split.format(i, "thunder"),
                                    split.format(i, "inductor"), 1.0, f"graph0/thunder_{i}") for i in (0, 2)]
    for n, phase in ((0, "forward"), (1, "forward"), (2, "backward"), (3, "backward")):
        comparisons.append(bench.Comparison("fusion", f"graph0/thunder_0/nvFusion{n} {phase}", "nvfuser",
                                            fusion.format(n, phase, "nvfuser"), fusion.format(n, phase, "inductor"),
                                            2.0 if n == 3 else 1.0, "graph0/thunder_0"))
    return comparisons


def test_triage_ranks_by_time_lost_per_step():
    comparisons = triage_plan()
    results = {s: bench.read_result(RESULTS / bench.result_name(s), s) for s in bench.scripts_of(comparisons)}
    ranked = bench.rank(comparisons, results, deviation=1.1)
    by_path = {r.comparison.path: r for r in ranked}
    # nvFusion3 backward: 0.30 vs 0.20 ms, run twice per step -> 0.2 ms lost per step, more than nvFusion0's 0.15.
    assert by_path["graph0/thunder_0/nvFusion3 backward"].loss_ms == pytest.approx(0.2)
    assert by_path["graph0/thunder_0/nvFusion0 forward"].loss_ms == pytest.approx(0.15)
    losses = [r.comparison.path for r in ranked if r.error is None and r.beyond and r.loss_ms > 0]
    assert losses[:3] == ["graph0/thunder_0", "graph0/thunder_0/nvFusion3 backward", "graph0/thunder_0/nvFusion0 forward"]
    # nvFusion1 is 5% slower: within the deviation. nvFusion2's inductor script failed (no result file).
    assert not by_path["graph0/thunder_0/nvFusion1 forward"].beyond
    assert by_path["graph0/thunder_0/nvFusion2 backward"].error and ranked[-1].error
    assert by_path["graph0/thunder_2"].loss_ms < 0 and by_path["graph0/thunder_2"].beyond  # a gain
    explained = {e.split: e for e in bench.explain(ranked)}["graph0/thunder_0"]
    assert explained.split_loss_ms == pytest.approx(0.5)
    assert explained.regions_beyond_loss_ms == pytest.approx(0.35)

    text = render_bench_report(ranked, 1.1, "fixture", script_prefix="rank0/")
    listed = text.split("## Where ThunderFX loses time")[1].split("## Where ThunderFX gains")[0]
    assert "nvFusion3" in listed and "nvFusion0" in listed and "nvFusion1" not in listed
    assert "rank0/graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion3_backward_repro_nvfuser.py" in listed
    assert "70%" in text  # 0.35 of the split's 0.5 ms per step explained by regions that deviate
    outside = explained.split_loss_ms - explained.regions_loss_ms  # what the split loses outside its regions
    assert f"| 70% | {outside:.3f} | - |" in text  # no run timing given
    text = render_bench_report(ranked, 1.1, "fixture", outside_in_run={"graph0/thunder_0": 1.25})
    assert f"| 70% | {outside:.3f} | 1.250 |" in text
    assert text.startswith("# thunderfx-debug bench: fixture\n")  # bench's report, not the triage's
    # Beside the flush-time triage: why the two can differ, and where they do.
    from thunderfx_debug.records import Triage

    triaged = {"graph0/thunder_0": Triage(ratio=1.33, ratio_low=1.21, ratio_high=1.46, deviates=True),
               "graph0/thunder_0/nvFusion0 forward": Triage(ratio=0.47, ratio_low=0.4, ratio_high=0.55, deviates=True)}
    beside = render_bench_report(ranked, 1.1, "fixture", triaged=triaged).split("## Beside the flush-time triage")[1]
    assert "on copies of the run's own tensors" in beside and "the triage's is the one measured as the run ran" in beside
    split_ratio = by_path["graph0/thunder_0"].ratio
    assert f"| graph0/thunder_0 | {split_ratio:.2f}x (slower) | 1.33x [1.21, 1.46] (slower) | agree |" in beside
    assert "| graph0/thunder_0/nvFusion0 forward | 1.50x (slower) | 0.47x [0.40, 0.55] (faster) | DISAGREE |" in beside
    assert "They disagree on 1 piece: graph0/thunder_0/nvFusion0 forward." in beside
    # Beyond 1.6x either way: the fusion regions (at most 1.5x) are all within it.
    wide = bench.rank(comparisons, results, deviation=1.6)
    assert not any(r.beyond for r in wide if r.comparison.level == "fusion")


def test_bench_judges_a_time_ratio_as_the_flush_time_triage_does():
    """One rule (`records.deviation_outcome`): bench's point ratio of two medians deviates exactly where the triage's
    interval, shrunk to that ratio, does; by default at the triage's own threshold."""
    from thunderfx_debug.triage import judging
    from thunderfx_debug.records import DEVIATION

    (split,) = [c for c in triage_plan() if c.path == "graph0/thunder_0"]
    verdicts = []
    for ratio in (0.5, 0.8, 0.85, 1.0, 1.15, 1.25, 3.0):
        ranked = bench.Ranked(split, ours_ms=ratio, theirs_ms=1.0)
        triage = judging.verdict([ratio] * 7, [1.0] * 7, DEVIATION)
        assert ranked.deviation == DEVIATION and ranked.beyond == triage["deviates"], ratio
        verdicts.append(ranked.beyond)
    assert verdicts == [True, True, False, False, False, True, True]


def test_triage_compares_device_time_where_both_scripts_measured_it(tmp_path):
    """On the H200 a small region's standalone inductor call cost ~0.1 ms of wrappers for ~0.02 ms of kernels: the
    wall clock blamed inductor for what it does not pay inside a compiled graph. Device time wins where both have it."""
    (fusion,) = [c for c in triage_plan() if c.path == "graph0/thunder_0/nvFusion0 forward"]
    (split,) = [c for c in triage_plan() if c.path == "graph0/thunder_0"]
    results = {
        fusion.ours_script: bench.ScriptResult(fusion.ours_script, 0.02, 0.05, forward_device_ms=0.015,
                                               backward_device_ms=0.04),
        fusion.theirs_script: bench.ScriptResult(fusion.theirs_script, 0.12, 0.20, forward_device_ms=0.010,
                                                 backward_device_ms=0.03),
        split.ours_script: bench.ScriptResult(split.ours_script, 2.0, None, forward_device_ms=1.5),
        split.theirs_script: bench.ScriptResult(split.theirs_script, 1.0),  # a CPU run: no device time
    }
    by_path = {r.comparison.path: r for r in bench.rank([fusion, split], results)}
    region = by_path[fusion.path]
    assert region.clock == "device" and region.ratio == pytest.approx(0.055 / 0.040)
    assert region.loss_ms > 0 and region.beyond  # on the wall clock it would have been a 3x gain
    assert by_path[split.path].clock == "wall" and by_path[split.path].ratio == pytest.approx(2.0)
    text = render_bench_report(list(by_path.values()), 1.1, "fixture")
    assert "| device |" in text and "| wall |" in text

    out = tmp_path / "negative.json"
    out.write_text(json.dumps({"forward_ms": 1.0, "forward_device_ms": -1.0}))
    assert "forward_device_ms must be a non-negative number" in bench.read_result(out, "x.py").error


def test_outside_in_run_sums_each_splits_time_outside_its_regions(normal):
    outside = bench.outside_in_run(normal)
    steps = digest.steps(normal).count
    for graph in normal.graphs:
        for split in graph.splits:
            timings = split.outside_fusions_timing.values()
            expected = sum(headline(t, left_out_calls(graph)).median_ms for t in timings) * graph.calls / steps
            assert outside.get(f"{graph.name}/{split.name}", 0.0) == pytest.approx(expected)
    assert outside and all(ms > 0 for ms in outside.values())


def test_plan_pairs_scripts_from_the_records(normal):
    def add_files(report: Report) -> Report:
        graphs = []
        for g in report.graphs:
            splits = []
            for s in g.splits:
                if s.kind is SplitKind.THUNDER:
                    files = {**s.files, "repro_thunder": f"{g.name}/{g.name}_{s.name}_repro_thunder.py",
                             "repro_inductor": f"{g.name}/{g.name}_{s.name}_repro_inductor.py"}
                    fusions = tuple(dataclasses.replace(f, files={
                        "repro_nvfuser": f"x/{g.name}_{s.name}_{f.qualified_name}_repro_nvfuser.py",
                        "repro_inductor": f"x/{g.name}_{s.name}_{f.qualified_name}_repro_inductor.py"})
                        for f in s.fusions)
                    s = dataclasses.replace(s, files=files, fusions=fusions)
                splits.append(s)
            graphs.append(dataclasses.replace(g, splits=tuple(splits)))
        return dataclasses.replace(report, graphs=tuple(graphs))

    recorded = {p for g in normal.graphs for s in g.splits for p in [*s.files.values(),
                *(v for f in s.fusions for v in f.files.values())]}
    assert all({c.ours_script, c.theirs_script} <= recorded for c in bench.plan(normal))
    comparisons = bench.plan(add_files(normal))
    thunder_splits = [s for g in normal.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    assert sum(c.level == "split" for c in comparisons) == len(thunder_splits)
    assert sum(c.level == "fusion" for c in comparisons) == sum(len(s.fusions) for s in thunder_splits)
    assert all(c.calls_per_step == 1.0 for c in comparisons)  # every graph ran once per step


def test_run_script_follows_the_json_contract(tmp_path):
    rank_dir = tmp_path / "rank0"
    rank_dir.mkdir()
    (rank_dir / "good_repro_thunder.py").write_text(
        "import json, sys\n"
        "assert sys.argv[1] == '--benchmark' and sys.argv[2] == '--json'\n"
        "json.dump({'script': __file__, 'piece': 'x', 'executor': 'thunder', 'forward_ms': 1.5, 'backward_ms': 2.0},"
        " open(sys.argv[3], 'w'))\n")
    (rank_dir / "bad_repro_inductor.py").write_text("import sys\nsys.exit('inductor failed: out of memory')\n")
    (rank_dir / "mismatch_repro_inductor.py").write_text(
        "import json, sys, warnings\n"
        "json.dump({'forward_ms': 0.5, 'backward_ms': None}, open(sys.argv[3], 'w'))\n"
        "print('  forward outputs vs eager: largest error 0.5: MISMATCH')\n"
        "warnings.warn('transformer_engine module not found!')\n"
        "sys.exit(1)\n")
    results = tmp_path / "results"
    results.mkdir()
    good = bench.run_script(rank_dir, "good_repro_thunder.py", results, timeout_s=60)
    assert (good.forward_ms, good.backward_ms, good.error) == (1.5, 2.0, None)
    bad = bench.run_script(rank_dir, "bad_repro_inductor.py", results, timeout_s=60)
    assert bad.error and "out of memory" in bad.error
    mismatch = bench.run_script(rank_dir, "mismatch_repro_inductor.py", results, timeout_s=60)
    assert mismatch.forward_ms == 0.5 and mismatch.error is None and "MISMATCH" in mismatch.note
    comparison = bench.Comparison("split", "graph0/thunder_0", "thunder", "good_repro_thunder.py",
                                  "mismatch_repro_inductor.py")
    ranked = bench.rank([comparison], {"good_repro_thunder.py": good, "mismatch_repro_inductor.py": mismatch})
    assert ranked[0].ours_ms == 1.5 and ranked[0].theirs_ms == 0.5  # forward only: inductor measured no backward
    assert "MISMATCH" in render_bench_report(ranked, 0.1, "t").split("failed their own check")[1]
    assert bench.run_script(rank_dir, "../escape.py", results, timeout_s=60).error
    assert bench.run_script(rank_dir, "missing_repro_thunder.py", results, timeout_s=60).error
