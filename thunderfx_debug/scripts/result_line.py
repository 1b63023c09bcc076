"""The RESULT protocol, both ends: every repro script ends by printing one line,
`RESULT <OUTCOME> (exit <status>)[: <detail>]; <meaning>`, and exits with that status (`Verdict.line` writes it; the
repro writer inlines this text into each script); the tests' and benchmarks' script runs (`children/standalone`),
the minimizer's trials (`minimize/verdict`) and `thunderfx-debug verify` read it (`last_result`, `outcome_of`).

    >>> print(Verdict(Outcome.NOT_COMPARABLE, "topk picked other tied values").line("Thunder", ["dropout"]))
    RESULT NOT COMPARABLE (exit 5): topk picked other tied values; the piece draws random numbers (dropout), which Thunder and eager draw differently even from the same seed: values not comparable, nothing is claimed
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

import dataclasses
import enum
import re


class Outcome(enum.IntEnum):
    """What a script found; the value is its exit status (the script's docstring says what each means)."""

    OK = 0
    MISMATCH = 1
    REFUSED = 3
    CRASH = 4
    NOT_COMPARABLE = 5
    NOT_REBUILT = 6
    REPRODUCED = 7
    NOT_REPRODUCED = 8


MEANINGS = {
    Outcome.OK: "the piece matches within the tolerance",
    Outcome.MISMATCH: "a finding about {backend}, worth reporting upstream with this script",
    Outcome.REFUSED: "the inputs this script built are not what the piece received in the run: a bug of "
                     "thunderfx_debug's input rebuild, not of {backend}",
    Outcome.CRASH: "{backend} raised on inputs that eager accepts",
    Outcome.NOT_COMPARABLE: "the piece draws random numbers ({random_ops}), which {backend} and eager draw "
                            "differently even from the same seed: values not comparable, nothing is claimed",
    Outcome.NOT_REBUILT: "this script could not rebuild the piece as the run built it, so {backend} never ran it: a "
                         "bug of thunderfx_debug's script (or of the printer of the backend's definition), no claim "
                         "about {backend}",
    Outcome.REPRODUCED: "the piece raised here what it raised in the run: the run's failure, reproduced by this "
                        "script on its own; report it upstream with this script",
    Outcome.NOT_REPRODUCED: "the piece failed in the run and does not fail so here: this script does not reproduce the "
                            "run's failure, and makes no claim that the piece works",
}


@dataclasses.dataclass
class Verdict:
    """A script's verdict: its outcome, what it found (`detail`), and `meaning` where not the outcome's usual one."""

    outcome: Outcome
    detail: str = ""
    meaning: str = ""

    def line(self, backend: str, random_ops=()) -> str:
        meaning = (self.meaning or MEANINGS[self.outcome]).format(backend=backend,
                                                                  random_ops=", ".join(random_ops) or "random ops")
        detail = f": {self.detail}" if self.detail else ""
        return f"RESULT {self.outcome.name.replace('_', ' ')} (exit {self.outcome.value}){detail}; {meaning}"


_RESULT = re.compile(r"^RESULT ([A-Z ]+?) \(exit (\d+)\)(.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ResultLine:
    """A script's RESULT line: `outcome` as a token ("NOT_COMPARABLE" for "NOT COMPARABLE"), the exit `status` it
    names, the whole `line`, and the `detail` after "(exit N):" ("" where the meaning follows at once)."""

    outcome: str
    status: int
    line: str
    detail: str


def last_result(output: str):
    """The last RESULT line (`ResultLine`) in what a script printed, or None where it printed none."""
    found = list(_RESULT.finditer(output))
    if not found:
        return None
    result = found[-1]
    rest = result.group(3)
    detail = rest[1:].strip() if rest.startswith(":") else ""  # "RESULT OK (exit 0); the piece matches ..." has none
    return ResultLine(result.group(1).replace(" ", "_"), int(result.group(2)), result.group(0), detail)


def outcome_of(returncode, output: str) -> str:
    """A run's outcome: its RESULT line's where that names the status the script exited with (`returncode`, an int
    or None); TIMEOUT where it was stopped (None), KILLED where a signal ended it (negative), NO_RESULT otherwise."""
    if returncode is None:
        return "TIMEOUT"
    if returncode < 0:
        return "KILLED"
    found = last_result(output)
    return found.outcome if found is not None and found.status == returncode else "NO_RESULT"
