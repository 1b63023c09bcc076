"""The report users get: the records of one rank (`records.RankRecord`) and, as `str(report)`, its readable
summary (what `summary.txt` holds)."""

from __future__ import annotations

import dataclasses

from thunderfx_debug.records import RankRecord
from thunderfx_debug.render.summary import render_summary


@dataclasses.dataclass(frozen=True)
class Report(RankRecord):
    """What the backend recorded about one process (rank) of a run; `str(report)` is the readable summary.

    Built by `ReportingBackend.report()` and read back from a dump by `thunderfx_debug.load_report(dir)`.
    """

    def __str__(self) -> str:
        return render_summary(self)
