"""The straggler view on records: ranks made from the checked-in fixtures with known differences (a region slower on
one rank, a collective in an inductor split, DDP's bucket graphs, flight-recorder logs), and the dump's log of
collectives read back and refused when damaged. No thunder, no processes."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from thunderfx_debug import load_report
from thunderfx_debug.records import (ClockKind, CollectiveCall, CollectiveLog, DumpError, GraphRecord, RankRecord, SplitKind,
                                     Timing)
from thunderfx_debug.recording.collectives import parse_entries
from thunderfx_debug.render import digest, ranks
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_ranks
from conftest import dump_fixtures

NORMAL = dump_fixtures() / "normal"


@pytest.fixture(scope="module")
def normal():
    return load_report(NORMAL)


def as_rank(report, rank: int, **meta):
    return dataclasses.replace(report, meta={**report.meta, "rank": rank, **meta})


def scaled(timing: Timing | None, factor: float) -> Timing | None:
    return None if timing is None else dataclasses.replace(timing, samples_ms=tuple(s * factor for s in timing.samples_ms))


def with_fusion_scaled(report, graph_name: str, split_name: str, fusion_name: str, phase: str, factor: float):
    graphs = []
    for g in report.graphs:
        splits = []
        for s in g.splits:
            fusions = tuple(dataclasses.replace(f, timing=scaled(f.timing, factor))
                            if (g.name, s.name, f.name, f.phase.value) == (graph_name, split_name, fusion_name, phase)
                            else f
                            for f in s.fusions)
            splits.append(dataclasses.replace(s, fusions=fusions))
        graphs.append(dataclasses.replace(g, splits=tuple(splits)))
    return dataclasses.replace(report, graphs=tuple(graphs))


def costliest_fusion(report):
    return max((p for p in digest.timed_pieces(report) if p.level is digest.PieceLevel.FUSION),
               key=lambda p: p.ms_per_step)


def test_the_slowest_rank_is_found_and_its_slow_piece_stands_out(normal):
    piece = costliest_fusion(normal)
    slow = with_fusion_scaled(as_rank(normal, 1), piece.graph, piece.split, piece.name, piece.phase, 4.0)
    # Its graph is slower too (a region inside it is): the graphs' samples carry the region's extra time.
    extra = 3.0 * piece.timing.median_ms
    slow = dataclasses.replace(slow, graphs=tuple(
        dataclasses.replace(g, timing=dataclasses.replace(g.timing, samples_ms=tuple(
            s + extra for s in g.timing.samples_ms))) if g.name == piece.graph else g for g in slow.graphs))
    reports = {0: as_rank(normal, 0), 1: slow, 2: as_rank(normal, 2)}

    steps = ranks.rank_steps(reports)
    spread = ranks.spread(steps)
    assert spread.slowest == 1 and spread.fastest in (0, 2)
    assert spread.excess_ms == pytest.approx(extra * piece.calls_per_step)
    assert spread.ratio == pytest.approx(spread.slowest_ms / spread.fastest_ms) and spread.ratio > 1

    rows = ranks.slowest_pieces(reports, 1)
    by_label = {row.label: row for row in rows}
    assert piece.label in by_label
    row = by_label[piece.label]
    assert row.excess_ms == pytest.approx(3.0 * piece.ms_per_step)
    assert row.ms_per_step[0] == row.ms_per_step[2] == pytest.approx(piece.ms_per_step)
    assert all(r.excess_ms == pytest.approx(0.0) for r in rows if r is not row)
    # Sorted by the slow rank's own time per step.
    own = [r.ms_per_step[1] for r in rows]
    assert own == sorted(own, reverse=True)

    text = render_ranks(reports)
    assert "the straggler view" in text and f"rank 1 is {spread.excess_ms:.3f} ms per step above" in text
    page = render_html(reports)
    assert "The straggler view" in page and "Rank 1's costliest pieces" in page
    assert f'<td class="num">{row.excess_ms:+.3f}</td>' in page


def test_a_piece_absent_on_another_rank_says_so(normal):
    piece = costliest_fusion(normal)
    other = as_rank(normal, 1)
    missing = dataclasses.replace(other, graphs=tuple(g for g in other.graphs if g.name != piece.graph))
    rows = ranks.slowest_pieces({0: as_rank(normal, 0), 1: missing}, 0)
    gone = [r for r in rows if r.label.startswith(piece.graph + "/")]
    assert gone and all(r.ms_per_step[1] is None for r in gone)
    assert all(r.excess_ms is None for r in gone)  # nothing to compare with


def with_collective_in(report, graph_name: str, split_name: str):
    op = "torch.ops._c10d_functional.all_reduce_.default"
    graphs = tuple(dataclasses.replace(g, splits=tuple(
        dataclasses.replace(s, ops=(*s.ops, op)) if (g.name, s.name) == (graph_name, split_name) else s
        for s in g.splits)) for g in report.graphs)
    return dataclasses.replace(report, graphs=graphs), op


def test_a_collective_inside_an_inductor_split_is_counted_with_its_split(normal):
    graph = next(g for g in normal.graphs if any(s.kind is SplitKind.INDUCTOR and s.timing for s in g.splits))
    split = next(s for s in graph.splits if s.kind is SplitKind.INDUCTOR and s.timing)
    report, op = with_collective_in(normal, graph.name, split.name)
    places = ranks.collective_places(report)
    assert [(p.place, p.kind, p.ops) for p in places] == [(f"{graph.name}/{split.name}", "inductor", (op,))]
    held = ranks.collective_pieces(report)  # the split's forward and its backward
    assert {(p.graph, p.split, p.level, p.phase) for p in held} == {
        (graph.name, split.name, digest.PieceLevel.SPLIT, phase) for phase in ("forward", "backward")}
    (step,) = ranks.rank_steps({0: report})
    assert step.collective_ms == pytest.approx(sum(p.ms_per_step for p in held)) and step.collective_ms > 0
    assert ranks.outside_graphs_note({0: report})[0].startswith("collectives inside compiled graphs are counted")
    assert f"collectives on rank 0 in {graph.name}/{split.name} (inductor): {op}" in render_ranks(
        {0: report, 1: as_rank(normal, 1)})


def test_ddp_bucket_graphs_are_one_compile_not_recompiles():
    brk = "DDPOptimizer intentional graph-break (See Note [DDPOptimizer]). Set `torch._dynamo.config.optimize_ddp`"
    graphs = (GraphRecord("graph0", 0, compile_id="0/0", break_reason=brk),
              GraphRecord("graph1", 1, compile_id="0/0", break_reason=brk),
              GraphRecord("graph2", 2, compile_id="0/0"),  # the last bucket ends with the frame
              GraphRecord("graph3", 3, compile_id="0/1"))  # a real recompile of the frame
    report = RankRecord(graphs=graphs)
    assert ranks.ddp_buckets(report) == {"0/0": ["graph0", "graph1", "graph2"]}
    assert digest.counts(report)["recompiles"] == 1
    assert [g.name for g in digest.recompiled_frames(report)["0"]] == ["graph0", "graph3"]


def collective_log(*created_ms: float, first_seq: int = 1, duration_ms: float | None = None) -> dict:
    calls = tuple(CollectiveCall("nccl:all_reduce", "0", first_seq + i, 10**18 + round(ms * 10**6), 1024, duration_ms)
                  for i, ms in enumerate(created_ms))
    return CollectiveLog("_dump_nccl_trace_json", 2000, calls).to_json()


def test_arrival_lags_match_collectives_by_group_and_sequence_number():
    reports = {
        0: RankRecord(meta={"rank": 0, "hostname": "a", "collectives": collective_log(0, 100, 200, 300)}),
        # Rank 1 is late by 7 ms everywhere, and its ring buffer lost the first collective.
        1: RankRecord(meta={"rank": 1, "hostname": "a", "collectives": collective_log(107, 207, 307, first_seq=2,
                                                                                      duration_ms=1.5)}),
        2: RankRecord(meta={"rank": 2, "hostname": "b", "collectives": collective_log(1, 101, 201, 301,
                                                                                      duration_ms=8.0)}),
    }
    lags = ranks.arrival_lags(reports)
    assert lags.matched == 3 and not lags.same_host
    assert dict(lags.last) == {0: 0, 1: 3, 2: 0}
    assert lags.median_lag_ms[1] == pytest.approx(7.0) and lags.median_lag_ms[2] == pytest.approx(1.0)
    assert lags.total_lag_ms[1] == pytest.approx(21.0) and lags.span_s == pytest.approx(0.2)
    (times,) = ranks.collective_times(reports)
    assert times.name == "nccl:all_reduce" and set(times.by_rank) == {1, 2}
    assert times.by_rank[2] == (4, 8.0, 32.0)
    text = render_ranks(reports)
    assert "3 found on every rank" in text and "the hosts' clocks, which may be offset" in text
    assert ranks.arrival_lags({0: reports[0]}) is None  # one log: nothing to compare


def test_the_collective_log_is_read_back_and_a_damaged_one_refused(tmp_path):
    dump = tmp_path / "dump"
    shutil.copytree(NORMAL, dump)
    manifest_path = dump / "rank0" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["collectives"] = collective_log(0, 5, duration_ms=2.0)
    manifest_path.write_text(json.dumps(manifest))
    log = load_report(dump).collectives
    assert [(c.seq, c.duration_ms, c.elements) for c in log.calls] == [(1, 2.0, 1024), (2, 2.0, 1024)]
    assert log == CollectiveLog.from_json(log.to_json(), "again")

    manifest["collectives"]["calls"]["seq"] = ["1", 2]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DumpError, match=r"collectives\.calls\.seq: expected a list of whole numbers"):
        load_report(dump)
    manifest["collectives"]["calls"]["seq"] = [1]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DumpError, match="must have the same length"):
        load_report(dump)


def test_flight_recorder_entries_keep_collectives_only():
    entries = [
        {"profiling_name": "nccl:all_gather", "process_group": ["1", "fsdp"], "collective_seq_id": 4,
         "time_created_ns": 5, "input_sizes": [[2, 3], [4]], "duration_ms": 0.25, "is_p2p": False},
        {"profiling_name": "nccl:send", "process_group": ["0", "default_pg"], "collective_seq_id": 0,
         "p2p_seq_id": 1, "time_created_ns": 6, "is_p2p": True},
        {"profiling_name": "gloo:all_reduce", "process_group": ["0", "default_pg"], "collective_seq_id": 9,
         "time_created_ns": 7, "input_sizes": [[8]], "duration_ms": None},
    ]
    assert parse_entries(entries) == [
        CollectiveCall("nccl:all_gather", "1", 4, 5, 10, 0.25),
        CollectiveCall("gloo:all_reduce", "0", 9, 7, 8, None),
    ]


def test_a_rank_without_timing_leaves_the_view_without_figures(normal):
    untimed = dataclasses.replace(normal, graphs=tuple(
        dataclasses.replace(g, timing=None, backward_timing=None, splits=tuple(
            dataclasses.replace(s, timing=None, backward_timing=None, outside_fusions_timing={},
                                fusions=tuple(dataclasses.replace(f, timing=None) for f in s.fusions))
            for s in g.splits)) for g in normal.graphs))
    reports = {0: as_rank(untimed, 0), 1: as_rank(untimed, 1)}
    assert ranks.spread(ranks.rank_steps(reports)) is None
    assert "no rank timed its graphs" in render_ranks(reports) and "No rank timed its graphs" in render_html(reports)


def with_step_period(report, period_ms: float):
    """The report with its first graph's call period (the step's wall time on the host clock) about `period_ms`."""
    first = report.graphs[0]
    calls = tuple(range(6, 6 + 10 * 5, 5))
    period = Timing(tuple(period_ms * (1 + 0.01 * (i % 3)) for i in range(len(calls))), calls, ClockKind.HOST)
    return dataclasses.replace(report, graphs=(dataclasses.replace(first, period_timing=period), *report.graphs[1:]))


def with_piece_slower(report, piece, factor: float):
    """The report with `piece` `factor` times slower, and its graph slower by as much."""
    slow = with_fusion_scaled(report, piece.graph, piece.split, piece.name, piece.phase, factor)
    extra = (factor - 1.0) * piece.timing.median_ms
    return dataclasses.replace(slow, graphs=tuple(
        dataclasses.replace(g, timing=dataclasses.replace(g.timing, samples_ms=tuple(
            s + extra for s in g.timing.samples_ms))) if g.name == piece.graph else g for g in slow.graphs))


def test_a_rank_late_at_the_collectives_but_quick_in_its_graphs_is_named_with_its_wall_time(normal):
    """Rank 0's graphs are the slowest, yet rank 1 enqueues every collective late: it loses its time outside the
    graphs (as a rank with a busy Python thread beside its training does), and its step's wall time shows it."""
    piece = costliest_fusion(normal)
    quick_graphs = with_step_period(as_rank(normal, 0, collectives=collective_log(0, 100, 200)), 100.0)
    slow_graphs = with_piece_slower(quick_graphs, piece, 4.0)
    late = with_step_period(as_rank(normal, 1, collectives=collective_log(30, 130, 230)), 130.0)
    reports = {0: slow_graphs, 1: late}
    steps = ranks.rank_steps(reports)
    assert ranks.spread(steps).slowest == 0 and steps[0].compiled_ms > steps[1].compiled_ms
    assert [s.wall_ms for s in steps] == [pytest.approx(100.0, rel=0.02), pytest.approx(130.0, rel=0.02)]
    sentence = ranks.late_outside_graphs(steps, ranks.arrival_lags(reports))
    assert sentence.startswith("rank 1 enqueued the collectives latest (median 30.000 ms behind")
    assert "rank 1 loses its time outside the compiled graphs" in sentence and f"its step's wall time is {steps[1].wall_ms:.3f} ms" in sentence
    assert sentence in render_ranks(reports) and "step wall time (host clock)" in render_ranks(reports)
    assert "Rank 1 enqueued the collectives latest" in render_html(reports)
    # Where the late rank is also the slowest in its graphs, the view's spread already names it: no sentence.
    agree = {0: with_step_period(as_rank(normal, 0, collectives=collective_log(0, 100, 200)), 100.0),
             1: with_piece_slower(late, piece, 4.0)}
    assert ranks.late_outside_graphs(ranks.rank_steps(agree), ranks.arrival_lags(agree)) is None


def test_the_latest_rank_is_late_at_most_collectives_not_once_for_long():
    """Rank 0 arrives 5 s late once (it compiled while rank 1 waited); rank 1 is 10 ms late at every other one."""
    reports = {0: RankRecord(meta={"rank": 0, "collectives": collective_log(5000, 5100, 5200, 5300)}),
               1: RankRecord(meta={"rank": 1, "collectives": collective_log(0, 5110, 5210, 5310)})}
    lags = ranks.arrival_lags(reports)
    assert lags.total_lag_ms[0] > lags.total_lag_ms[1] and dict(lags.last) == {0: 1, 1: 3}
    assert lags.latest == 1
    assert "rank 1 enqueued latest" in render_ranks(reports)
