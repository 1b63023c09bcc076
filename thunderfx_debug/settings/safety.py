"""Fail-safe reporting: a failure inside thunderfx_debug is logged once, with what was being done, and never reaches
the training (unless strict mode asks for it, as tests do).

Example:
    >>> failures = ReportingFailures(strict=False)
    >>> with failures.guard("reading the traces of graph0/thunder_0"):
    ...     raise RuntimeError("boom")          # logged once as a warning; execution goes on after the block
    >>> failures.failures[0]["what"]
    'reading the traces of graph0/thunder_0'

`describe_exception` is the text a record keeps of an exception of the user's run (a graph Thunder failed on).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections import Counter
from collections.abc import Iterator

log = logging.getLogger("thunderfx_debug")

#: Failures kept with their details; more are only counted, so that a hook failing on every sampled call of a long
#: run cannot grow the process's memory.
MAX_KEPT_FAILURES = 100


class ReportingFailures:
    """Collects the failures of the reporting itself; each distinct (kind of work, exception type) is logged once.

    `failures` holds the first `MAX_KEPT_FAILURES` as {"what", "error", "traceback"}; `counts` counts all of them by
    (kind of work, exception type and errno), where the kind of work is `what` up to its first " of " ("reading the
    traces"): the same failure on every split or every sampled call is logged once, a full disk and a read-only
    directory twice.
    """

    def __init__(self, strict: bool):
        self.strict = strict
        self.failures: list[dict[str, str]] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self._noted: set[str] = set()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Runs the block; an exception in it is recorded and logged (re-raised in strict mode).

        `what` says what was being recorded, e.g. "reading the traces of graph0/thunder_0". Only `Exception`s are
        caught: KeyboardInterrupt and SystemExit go through, as they would without the reporting.
        """
        try:
            yield
        except Exception as e:
            self.record(what, e)
            if self.strict:
                raise

    def note_once(self, kind: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Logs `message % args` (at `level`) the first time `kind` is noted: something the reporting could not do,
        or did otherwise, for a reason that is no failure of its own (the device had no memory for a check, no room
        for a child), said once per run."""
        if kind not in self._noted:
            self._noted.add(kind)
            log.log(level, message, *args)

    def record(self, what: str, error: BaseException) -> None:
        summary = f"{type(error).__name__}: {error}"
        # A full disk and a read-only directory are different problems, though both are OSErrors.
        errno_name = f" errno {error.errno}" if isinstance(error, OSError) and error.errno else ""
        key = (what.split(" of ")[0], type(error).__name__ + errno_name)
        self.counts[key] += 1
        if len(self.failures) < MAX_KEPT_FAILURES:
            details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            self.failures.append({"what": what, "error": summary[:2000], "traceback": details[-4000:]})
        if self.counts[key] == 1:
            log.warning(
                "thunderfx_debug: failed while %s (%s); training goes on, the report may be incomplete. "
                "Set THUNDERFX_DEBUG_STRICT=1 to raise instead.",
                what,
                summary,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )


def describe_exception(error: BaseException, head: int = 2000, tail: int = 10000) -> str:
    """The exception's traceback and message, short enough for a JSON field: whole up to `head` + `tail` characters,
    else its first lines up to `head` characters and its last (the innermost frames and the message) up to `tail`,
    cut between lines, with a line saying how many were left out.

    Example:
        >>> try:
        ...     raise ValueError("x" * 30)
        ... except ValueError as e:
        ...     text = describe_exception(e, head=10, tail=60)
        >>> text.startswith("[") and "lines left out]" in text, text.endswith("ValueError: " + "x" * 30 + chr(10))
        (True, True)
    """
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if len(text) <= head + tail:
        return text
    lines = text.splitlines(keepends=True)
    first, size = 0, 0
    while first < len(lines) and size + len(lines[first]) <= head:
        size += len(lines[first])
        first += 1
    last, size = len(lines), 0
    while last > first and size + len(lines[last - 1]) <= tail:
        size += len(lines[last - 1])
        last -= 1
    if last == len(lines):  # one last line longer than `tail`: kept whole, it is the message
        last -= 1
    return "".join(lines[:first]) + f"[{last - first} lines left out]\n" + "".join(lines[last:])
