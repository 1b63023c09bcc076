"""Timing samples as a Chrome / Perfetto trace (`trace.json`): one complete event ("ph": "X") per sample.

Samples carry their durations, not their start times (events are read as elapsed times), so each sampled call is
laid out as a row per piece: graphs on one track, splits and fusion regions on their own, one sampled call after
the other, to compare pieces of the same call side by side.
"""

from __future__ import annotations

from typing import Any

from thunderfx_debug.records import Report, Timing


def _events(name: str, track: str, timing: Timing | None, pid: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    if timing is None:
        return []
    return [
        {"name": name, "cat": track, "ph": "X", "pid": pid, "tid": track, "ts": call * 1000.0, "dur": ms * 1000.0,
         "args": {**args, "call": call, "ms": ms}}
        for ms, call in zip(timing.samples_ms, timing.calls or range(len(timing.samples_ms)))
    ]


def chrome_trace(report: Report) -> dict[str, Any]:
    """The trace of `report` as a JSON-ready dict ({"traceEvents": [...]}), time axis in units of sampled calls."""
    pid = report.rank
    events: list[dict[str, Any]] = []
    for graph in report.graphs:
        for phase, timing in (("forward", graph.timing), ("backward", graph.backward_timing)):
            events += _events(f"{graph.name} {phase}", f"{graph.name}", timing, pid, {"phase": phase})
        for split in graph.splits:
            for phase, timing in (("forward", split.timing), ("backward", split.backward_timing)):
                events += _events(f"{graph.name}/{split.name} {phase}", f"{graph.name} splits", timing, pid, {"phase": phase})
            for fusion in split.fusions:
                events += _events(
                    f"{graph.name}/{split.name}/{fusion.name} {fusion.phase.value}",
                    f"{graph.name} fusions",
                    fusion.timing,
                    pid,
                    {"executor": fusion.executor, "phase": fusion.phase.value},
                )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"rank": report.rank}}
