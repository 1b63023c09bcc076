"""What every child process and this one say to each other, and how a child's end is read and said.

Messages: one JSON object a line, UTF-8. Jobs go into a long-lived child on its stdin; its answers come back on a
pipe of their own (`AnswerPipe`), never on its stdout, which belongs to the scripts and libraries it runs; a child
whose record must outlive it appends its lines to a file (the triage's `results.jsonl`), read back with `messages`,
which skips the torn last line of a child killed while writing it. `pool`'s worker writes the same lines from code
that cannot import this package (it runs repro scripts, which must stand alone).

An exit status, as every runner here returns it: the child's own status (0, or what it exited with), negative where a
signal killed it (`subprocess`'s and `os.waitstatus_to_exitcode`'s rule), None where it ran past its time limit and
was ended. `how_it_ended` says one in words. A child ends one way: a runner that gives up on it kills its process
group (`end_group`), every child being started as a group of its own, so that what it started (inductor's compile
workers, a script's own children) ends with it.

The scripts' RESULT line (`scripts.result_line`) is not a message of this protocol: it is what a repro script tells
its user, and what every runner reads from a script's output to know its verdict.

    >>> message_line({"id": 3, "status": 0})
    '{"id": 3, "status": 0}\\n'
    >>> list(messages('{"id": 3}\\n{"id": 4}\\n{"id"'))  # the last line torn by a kill
    [{'id': 3}, {'id': 4}]
    >>> how_it_ended(2), how_it_ended(-6)
    ('ended with exit status 2', 'was killed by signal 6 (SIGABRT)')
    >>> how_it_ended(None, 300)
    'ran past 300 s and was ended'
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any


def message_line(message: Mapping[str, Any]) -> str:
    """`message` as one line of the protocol."""
    return json.dumps(message) + "\n"


def messages(text: str) -> Iterator[dict[str, Any]]:
    """The messages in `text`, one a line; a line that is not one (the last line of a child killed while writing it)
    is left out."""
    for line in text.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(message, dict):
            yield message


class AnswerPipe:
    """The reading end of a pipe a child answers on, one message a line: make it before starting the child, pass the
    child `child_fd` (`subprocess.Popen(..., pass_fds=(pipe.child_fd,))`), then call `started` to close this process's
    copy of it, so that the pipe ends when the child does."""

    def __init__(self):
        read_fd, self.child_fd = os.pipe()
        self._reading = os.fdopen(read_fd, "rb", buffering=0)
        self._buffer = b""

    def started(self) -> None:
        """The child holds its end: this process's copy is closed (also where the child could not be started)."""
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    def receive(self, deadline: float | None = None) -> dict[str, Any] | None | str:
        """The next message; "timeout" past `deadline` (a time.monotonic() value; None waits without end); None where
        the child ended (the pipe closed) first."""
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return "timeout"
            ready, _, _ = select.select([self._reading], [], [], 5.0 if left is None else min(left, 5.0))
            if not ready:
                continue
            chunk = os.read(self._reading.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        self.started()
        try:
            self._reading.close()
        except OSError:
            pass


def signal_words(number: int) -> str:
    """A signal by number and name ("signal 6 (SIGABRT)")."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def how_it_ended(status: int | None, limit_s: float | None = None) -> str:
    """An exit status in words, to follow "the process that ..." (`limit_s`: the time limit it ran past, where None)."""
    if status is None:
        limit = f"{limit_s:.0f} s" if limit_s is not None else "its time limit"
        return f"ran past {limit} and was ended"
    if status < 0:
        return f"was killed by {signal_words(-status)}"
    return f"ended with exit status {status}"


def end_group(pid: int) -> None:
    """Kills the process `pid` and what it started (its process group: every child here is started as a group of
    its own), where it still runs; killing the process alone (`subprocess`'s kill and timeouts) would leave
    inductor's compile workers and a script's children running."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
