"""The RESULT line, read back in one place. Every repro script ends by printing one line,
`RESULT <OUTCOME> (exit <status>)[: <detail>]; <meaning>`, and exits with that status (`script_template.Verdict.line`
writes it); the tests' and benchmarks' script runs (`standalone`), the minimizer's trials (`minimize.verdict`) and
`thunderfx-debug verify` read it here.

    >>> found = last_result("  gradients vs eager: ...\\n"
    ...                     "RESULT NOT COMPARABLE (exit 5): topk picked other tied values; nothing is claimed")
    >>> found.outcome, found.status, found.detail
    ('NOT_COMPARABLE', 5, 'topk picked other tied values; nothing is claimed')
    >>> last_result("RESULT OK (exit 0); the piece matches within the tolerance").detail
    ''
    >>> outcome_of(5, found.line), outcome_of(0, found.line), outcome_of(1, "")
    ('NOT_COMPARABLE', 'NO_RESULT', 'NO_RESULT')
    >>> outcome_of(-6, ""), outcome_of(None, "")
    ('KILLED', 'TIMEOUT')
"""

from __future__ import annotations

import dataclasses
import re

_RESULT = re.compile(r"^RESULT ([A-Z ]+?) \(exit (\d+)\)(.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ResultLine:
    """A script's RESULT line: `outcome` as a token ("NOT_COMPARABLE" for "NOT COMPARABLE"), the exit `status` it
    names, the whole `line`, and the `detail` after "(exit N):" ("" where the meaning follows at once)."""

    outcome: str
    status: int
    line: str
    detail: str


def last_result(output: str) -> ResultLine | None:
    """The last RESULT line in what a script printed, or None where it printed none."""
    found = list(_RESULT.finditer(output))
    if not found:
        return None
    result = found[-1]
    rest = result.group(3)
    detail = rest[1:].strip() if rest.startswith(":") else ""  # "RESULT OK (exit 0); the piece matches ..." has none
    return ResultLine(result.group(1).replace(" ", "_"), int(result.group(2)), result.group(0), detail)


def outcome_of(returncode: int | None, output: str) -> str:
    """A run's outcome: its RESULT line's where that names the status the script exited with; TIMEOUT where it was
    stopped (`returncode` None), KILLED where a signal ended it (negative), NO_RESULT otherwise."""
    if returncode is None:
        return "TIMEOUT"
    if returncode < 0:
        return "KILLED"
    found = last_result(output)
    return found.outcome if found is not None and found.status == returncode else "NO_RESULT"
