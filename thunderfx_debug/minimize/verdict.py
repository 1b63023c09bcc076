"""What one run of a script found, read from what every repro script prints (`script_template`: one RESULT line
with the exit status, and a line per comparison), and whether a trial fails the same way as the piece it was cut
from.

The same failure: a MISMATCH stays a MISMATCH of the same kind of value (forward outputs, gradients, or values
that changed after the piece returned them; a piece that mismatches in several ways must keep the first of these
in that order); a CRASH stays a CRASH with the same exception type and the same head of its message (digits
aside); a REPRODUCED (the piece raised what the run raised, as its script judges by `scripts/run_failure`) stays
REPRODUCED; a process killed by a signal (a device assert aborts it) is killed by the same signal. A MISMATCH that
becomes a CRASH, an OK, a timeout or anything else is not the same failure.

Example:
    >>> run = read_run(1, "  forward outputs vs eager: largest error 4; worst value 0 ... : MISMATCH\\n"
    ...                   "RESULT MISMATCH (exit 1): results differ beyond the tolerance; a finding about Thunder")
    >>> run.outcome, sorted(run.kinds), run.failing
    ('MISMATCH', ['forward'], True)
    >>> crash = read_run(4, "RESULT CRASH (exit 4): RuntimeError: no sin for t12; Thunder raised on inputs that ...")
    >>> crash.same_failure_as(read_run(4, "RESULT CRASH (exit 4): RuntimeError: no sin for t3; Thunder raised"))
    True
    >>> run.same_failure_as(crash), read_run(-6, "").describe()
    (False, 'killed by signal 6 (SIGABRT)')
    >>> read_run(0, "RESULT OK (exit 0); the piece matches within the tolerance").outcome
    'OK'
"""

from __future__ import annotations

import dataclasses
import re

from thunderfx_debug.children.protocol import how_it_ended, signal_words
from thunderfx_debug.scripts.result_line import last_result

#: What a trial counts as failing: the verdicts `thunderfx-debug minimize` shrinks.
FAILING = ("MISMATCH", "CRASH", "KILLED", "REPRODUCED")
#: The kinds of value a MISMATCH is about, the one that decides first.
KINDS = ("changed", "forward", "gradients")


@dataclasses.dataclass(frozen=True)
class ScriptVerdict:
    """One run of a script. `outcome` from its RESULT line (or KILLED: ended by a signal; TIMEOUT; NO_RESULT: it
    ended without a RESULT line that matches its exit status); `kinds` the kinds of value that mismatched;
    `crash` the exception of a CRASH (digits masked), or the signal of a KILLED run; `reproduces` for a
    mismatch script (which always says MISMATCH): whether running the piece again here reproduced it."""

    outcome: str
    line: str = ""
    kinds: frozenset[str] = frozenset()
    crash: str = ""
    reproduces: bool | None = None
    returncode: int | None = None
    seconds: float = 0.0
    output: str = dataclasses.field(default="", repr=False, compare=False)  # the end of what it printed

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING and self.reproduces is not False

    @property
    def kind(self) -> str | None:
        """The kind of value that decides what the same MISMATCH is (see the module docstring)."""
        return next((k for k in KINDS if k in self.kinds), None)

    def same_failure_as(self, other: ScriptVerdict) -> bool:
        """Whether `other` fails the way this run failed."""
        if not (self.failing and other.failing) or self.outcome != other.outcome:
            return False
        if self.outcome == "MISMATCH":
            return self.kind is None or self.kind in other.kinds
        return self.crash == other.crash

    def describe(self) -> str:
        if self.outcome == "KILLED":
            return f"killed by {self.crash}"
        if self.outcome == "TIMEOUT":
            return "no verdict: it ran past its time limit and was stopped"
        if self.outcome == "NO_RESULT":
            last = next((line.strip() for line in reversed(self.output.splitlines()) if line.strip()), "")
            return (f"no verdict: it {how_it_ended(self.returncode)} and no RESULT line"
                    + (f" (its last line: {last[:200]})" if last else ""))
        return self.line or self.outcome


def read_run(returncode: int | None, output: str, seconds: float = 0.0) -> ScriptVerdict:
    """The verdict of a run that ended with `returncode` (negative: killed by that signal; None: timed out) after
    printing `output`."""
    tail = output[-4000:]
    if returncode is None:
        return ScriptVerdict("TIMEOUT", seconds=seconds, output=tail)
    if returncode < 0:
        return ScriptVerdict("KILLED", crash=signal_words(-returncode), returncode=returncode, seconds=seconds,
                             output=tail)
    result = last_result(output)
    if result is None or result.status != returncode:
        return ScriptVerdict("NO_RESULT", returncode=returncode, seconds=seconds, output=tail)
    outcome, detail = result.outcome, result.detail
    kinds: set[str] = set()
    for line in output.splitlines():
        text = line.strip()
        if text.startswith("the run's"):  # a mismatch script's comparison of what the run produced, not of this run
            continue
        if "changed after the piece returned them" in text:
            kinds.add("changed")
        elif text.endswith(": MISMATCH") and ":" in text:
            label = text.split(":", 1)[0]
            kinds.add("gradients" if "gradient" in label else "forward")
    crash = ""
    if outcome == "CRASH":
        crash = re.sub(r"\d+", "#", detail.split("; ", 1)[0].removeprefix("building the piece raised "))[:80]
    reproduces = None
    if "outside the run" in detail:  # a mismatch script: "outside the run, with thunder: reproduces"
        reproduces = ": reproduces" in detail
    return ScriptVerdict(outcome, result.line, frozenset(kinds), crash, reproduces, returncode, seconds, tail)
