"""Timing samples as a Chrome / Perfetto trace (`trace.json`): one complete event ("ph": "X") per sample.

Samples are durations, not start times (CUDA events are read as elapsed times), so each sampled call is laid out
in a slot of its own, and inside it the pieces of that call are packed in the order they run:
- track "graphN": the graph's forward, then its backward;
- track "graphN splits": the splits' forwards in split order from the slot's start, their backwards in reverse
  order (the order autograd runs them) from the end of the graph's forward;
- track "graphN fusions": inside each thunder split's forward (and backward), its fusion regions in trace order,
  then one event for the split's time outside fusion regions (which is really spread between the regions).
Event names are those of the NVTX ranges (`THUNDERFX_DEBUG_NVTX=1`): "graph0/thunder_0/nvFusion0_forward".
The order is real; the gaps between pieces are not recorded, so pieces start where the previous one ended. Slots
of the same call number line up across graphs (graphs called once per step then show one step per slot). The time
axis is in microseconds, as the format wants.
"""

from __future__ import annotations

from typing import Any

from thunderfx_debug.records import GraphRecord, RankRecord, SplitKind, SplitRecord, Timing
from thunderfx_debug.records.keys import PieceKey

_SLOT_MARGIN = 1.25  # a slot is this times the longest call, so consecutive calls stay apart


def _by_call(timing: Timing | None) -> dict[int, float]:
    return {} if timing is None else timing.by_call


class _Tracks:
    """Numeric thread ids with names (Perfetto wants numbers; the names come as metadata events)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.ids: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []

    def add(self, track: str, name: str, start_us: float, ms: float, args: dict[str, Any]) -> None:
        tid = self.ids.setdefault(track, len(self.ids) + 1)
        self.events.append({"name": name, "cat": track, "ph": "X", "pid": self.pid, "tid": tid, "ts": start_us,
                            "dur": ms * 1000.0, "args": {**args, "ms": ms}})

    def metadata(self) -> list[dict[str, Any]]:
        names = [{"name": "process_name", "ph": "M", "pid": self.pid, "args": {"name": f"rank {self.pid}"}}]
        for track, tid in self.ids.items():
            names.append({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": track}})
            names.append({"name": "thread_sort_index", "ph": "M", "pid": self.pid, "tid": tid,
                          "args": {"sort_index": tid}})
        return names


def _phase_ms(graph: GraphRecord, call: int, phase: str) -> float:
    """The graph's time in `phase` on `call`: its own sample, else what its splits add up to."""
    own = _by_call(graph.timing if phase == "forward" else graph.backward_timing).get(call)
    if own is not None:
        return own
    return sum(_by_call(s.timing if phase == "forward" else s.backward_timing).get(call, 0.0) for s in graph.splits)


def _layout_fusions(tracks: _Tracks, graph: GraphRecord, split: SplitRecord, call: int, phase: str, start_us: float):
    track = f"{graph.name} fusions"
    cursor = start_us
    for fusion in split.fusions_in(phase):
        ms = _by_call(fusion.timing).get(call)
        if ms is not None:
            tracks.add(track, PieceKey.of(graph.name, split.name, fusion.qualified_name), cursor, ms,
                       {"call": call, "phase": phase, "executor": fusion.executor, "split": split.name})
            cursor += ms * 1000.0
    outside = _by_call(split.outside_fusions_timing.get(f"outside_{phase}")).get(call)
    if outside is not None:
        tracks.add(track, f"{PieceKey.of(graph.name, split.name)} outside fusions {phase}", cursor, outside,
                   {"call": call, "phase": phase, "split": split.name,
                    "note": "time of the split's trace outside fusion regions, spread between them"})


def _layout_call(tracks: _Tracks, graph: GraphRecord, call: int, slot_us: float) -> None:
    forward_ms = _phase_ms(graph, call, "forward")
    for phase, ms, start in (("forward", _by_call(graph.timing).get(call), slot_us),
                             ("backward", _by_call(graph.backward_timing).get(call), slot_us + forward_ms * 1000.0)):
        if ms is not None:
            tracks.add(graph.name, f"{graph.name} {phase}", start, ms, {"call": call, "phase": phase})
    split_track = f"{graph.name} splits"
    for phase, splits, cursor in (("forward", graph.splits, slot_us),
                                  ("backward", tuple(reversed(graph.splits)), slot_us + forward_ms * 1000.0)):
        for split in splits:
            ms = _by_call(split.timing if phase == "forward" else split.backward_timing).get(call)
            if split.kind is SplitKind.THUNDER and split.fusions:
                _layout_fusions(tracks, graph, split, call, phase, cursor)
            if ms is not None:
                tracks.add(split_track, f"{PieceKey.of(graph.name, split.name)} {phase}", cursor, ms,
                           {"call": call, "phase": phase, "kind": split.kind.value})
                cursor += ms * 1000.0


def _sampled_calls(graph: GraphRecord) -> set[int]:
    timings = [graph.timing, graph.backward_timing]
    for split in graph.splits:
        timings += [split.timing, split.backward_timing, *(f.timing for f in split.fusions),
                    *split.outside_fusions_timing.values()]
    return {call for t in timings for call in _by_call(t)}


def chrome_trace(report: RankRecord) -> dict[str, Any]:
    """The trace of `report` as a JSON-ready dict ({"traceEvents": [...]}), time in microseconds."""
    tracks = _Tracks(report.rank)
    calls_of = {graph.name: _sampled_calls(graph) for graph in report.graphs}
    slot_of = {call: i for i, call in enumerate(sorted(set().union(*calls_of.values())))}
    longest_ms = max(
        (_phase_ms(g, c, "forward") + _phase_ms(g, c, "backward") for g in report.graphs for c in calls_of[g.name]),
        default=0.0,
    )
    slot_us = max(longest_ms * 1000.0 * _SLOT_MARGIN, 1.0)
    for graph in report.graphs:
        for call in sorted(calls_of[graph.name]):
            _layout_call(tracks, graph, call, slot_of[call] * slot_us)
    return {
        "traceEvents": tracks.metadata() + tracks.events,
        "displayTimeUnit": "ms",
        "otherData": {"rank": report.rank, "layout": "one slot per sampled call; pieces packed in run order"},
    }
