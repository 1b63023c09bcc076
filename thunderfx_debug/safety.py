"""Fail-safe reporting: a failure inside thunderfx_debug is logged once, with what was being done, and never reaches
the training (unless strict mode asks for it, as tests do)."""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator

log = logging.getLogger("thunderfx_debug")


class ReportingFailures:
    """Collects the failures of the reporting itself; each distinct (what, exception type) is logged once."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.failures: list[dict[str, str]] = []
        self._logged: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Runs the block; an exception in it is recorded and logged (re-raised in strict mode).

        `what` says what was being recorded, e.g. "reading the traces of graph0/thunder_0".
        """
        try:
            yield
        except Exception as e:
            self.record(what, e)
            if self.strict:
                raise

    def record(self, what: str, error: BaseException) -> None:
        summary = f"{type(error).__name__}: {error}"
        self.failures.append({"what": what, "error": summary[:2000], "traceback": traceback.format_exc()[-4000:]})
        key = (what.split(" of ")[0], type(error).__name__)
        if key not in self._logged:
            self._logged.add(key)
            log.warning(
                "thunderfx_debug: failed while %s (%s); training goes on, the report may be incomplete. "
                "Set THUNDERFX_DEBUG_STRICT=1 to raise instead.",
                what,
                summary,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
