"""Progress of long work: a tqdm bar where a person watches a terminal, log lines otherwise, nothing for short work;
and the flush of a dump with many scripts reports through it."""

from __future__ import annotations

import io
import logging
import time

import pytest

from thunderfx_debug.render.progress import progress, wants_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar(monkeypatch):
    pytest.importorskip("tqdm")
    monkeypatch.delenv("TERM", raising=False)
    screen = Terminal()
    assert wants_bar(screen) and not wants_bar(io.StringIO())
    with progress(3, "timing", unit="script", stream=screen, delay_s=0) as step:
        for name in ("a.py", "b.py", "c.py"):
            step(name)
    drawn = screen.getvalue()
    assert "timing" in drawn and "3/3" in drawn and "c.py" in drawn
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_bar(Terminal())


def test_elsewhere_log_lines_at_most_every_so_often_and_the_last(caplog, monkeypatch):
    clock = iter([0.0, 0.5, 5.0, 12.0, 13.0, 30.0])  # start, then one reading per step
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="thunderfx_debug"):
        with progress(5, "writing repro scripts", unit="piece", bar=False, delay_s=1.0, every_s=10.0) as step:
            for i in range(5):
                step(f"graph0/thunder_{i}")
    # 0.5 s: before the delay; 5 s: the first line; 12 s: within 10 s of it; 13 s: not yet due; 30 s: the last.
    assert [r.getMessage() for r in caplog.records] == [
        "writing repro scripts: 2/5 pieces (graph0/thunder_1)",
        "writing repro scripts: 5/5 pieces (graph0/thunder_4)",
    ]


def test_short_work_and_disabled_progress_say_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="thunderfx_debug"):
        with progress(3, "quick", bar=False, delay_s=60) as step:
            step(), step(), step()
        with progress(3, "off", enabled=False, delay_s=0, every_s=0) as step:
            step(), step(), step()
    assert caplog.records == []


def test_a_flush_with_many_scripts_reports_its_progress(tmp_path, caplog, monkeypatch):
    import torch

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.render import progress as progress_module

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.b(torch.sinc(self.a(x)))  # thunder_0, inductor_1 (sinc), thunder_2

    monkeypatch.setattr(progress_module, "wants_bar", lambda stream=None: False)
    monkeypatch.setattr("thunderfx_debug.artifacts.dump_contents.progress", _immediate(progress_module.progress))
    backend = ReportingBackend(dump_dir=tmp_path, repro="graph,split", strict=True)
    torch.compile(Gated(), backend=backend)(torch.randn(2, 8)).sum().backward()
    with caplog.at_level(logging.INFO, logger="thunderfx_debug"):
        backend.flush()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("writing repro scripts")]
    (graph,) = backend.report().graphs
    pieces = 1 + len(graph.splits)  # the graph's scripts, then each split's
    assert pieces == 4
    assert [line.split(" (")[0] for line in lines] == [f"writing repro scripts: {i}/4 pieces" for i in range(1, 5)]
    assert lines[0].endswith("(graph0)") and lines[-1].endswith(f"(graph0/{graph.splits[-1].name})")


def _immediate(progress_fn):
    """`progress` with no delay and a line per item, so that a fast test flush shows what a slow one would."""

    def immediate(*args, **kwargs):
        return progress_fn(*args, **{**kwargs, "delay_s": 0, "every_s": 0})

    return immediate
