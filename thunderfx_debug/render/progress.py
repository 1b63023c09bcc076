"""Progress of long work (writing many repro scripts at flush, `bench`, the demo's training): a tqdm bar on a
terminal, log lines otherwise (a CI log, a file, a job scheduler's output).

    with progress(len(scripts), "timing scripts", unit="script") as step:
        for script in scripts:
            run(script)
            step(script)                # one item done; the text shows beside the bar or in the log line

The bar needs tqdm (an optional extra) and stderr on a terminal (TERM not "dumb"); without them, lines go to the
"thunderfx_debug" logger at INFO level, at most one every `every_s` seconds and one at the end, and only once the
work has lasted `delay_s` (so that a short flush says nothing). A library does not configure logging: the lines
appear where the program sends INFO records (the command line sends them to stderr).

Example (log lines, every item):
    >>> import logging, sys
    >>> handler = logging.StreamHandler(sys.stdout)
    >>> logging.getLogger("thunderfx_debug").addHandler(handler)
    >>> logging.getLogger("thunderfx_debug").setLevel(logging.INFO)
    >>> with progress(2, "writing scripts", unit="script", bar=False, delay_s=0, every_s=0) as step:
    ...     step("a.py"); step("b.py")
    writing scripts: 1/2 scripts (a.py)
    writing scripts: 2/2 scripts (b.py)
    >>> logging.getLogger("thunderfx_debug").removeHandler(handler)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from thunderfx_debug.render.text import plural

log = logging.getLogger("thunderfx_debug")

Step = Callable[..., None]


def wants_bar(stream: TextIO | None = None) -> bool:
    """A bar only where a person watches: tqdm installed, `stream` (stderr) a terminal that is not "dumb"."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        import tqdm  # noqa: F401  (an optional extra)
    except ImportError:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def progress(total: int, desc: str, unit: str = "item", *, enabled: bool = True, bar: bool | None = None,
             delay_s: float = 1.0, every_s: float = 10.0, stream: TextIO | None = None) -> Iterator[Step]:
    """Yields `step(text="")`, to call once per finished item (thread-safe).

    Args:
        total: items to do; nothing is shown for 0.
        desc: what is being done ("writing repro scripts").
        unit: an item's name, singular ("script"; plurals add "s").
        enabled: False shows nothing (e.g. on ranks other than 0).
        bar: force the bar on or off; None decides by `wants_bar`.
        delay_s: seconds before anything is shown; shorter work shows nothing.
        every_s: at most one log line per this many seconds (the bar redraws as tqdm likes).
        stream: where the bar goes (default: stderr).
    """
    if not enabled or total <= 0:
        yield lambda text="": None
        return
    stream = sys.stderr if stream is None else stream
    if wants_bar(stream) if bar is None else bar:
        with _bar(total, desc, unit, delay_s, stream) as step:
            yield step
        return
    yield _log_lines(total, desc, unit, delay_s, every_s)


@contextlib.contextmanager
def _bar(total: int, desc: str, unit: str, delay_s: float, stream: TextIO) -> Iterator[Step]:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    # Log records written while the bar is up go through tqdm.write, so they do not tear the bar apart.
    with logging_redirect_tqdm(loggers=[logging.root, log]), tqdm(
        total=total, desc=desc, unit=f" {unit}", file=stream, delay=delay_s, dynamic_ncols=True, leave=False
    ) as bar:
        lock = threading.Lock()
        started = time.monotonic()

        def step(text: str = "") -> None:
            # Redrawn at every item once the delay has passed: items here take long (a script, a training step),
            # and tqdm's own throttle would otherwise leave the last item of a quick burst undrawn.
            with lock:
                if text:
                    bar.set_postfix_str(text, refresh=False)
                bar.update(1)
                if time.monotonic() - started >= delay_s:
                    bar.refresh()

        yield step


def _log_lines(total: int, desc: str, unit: str, delay_s: float, every_s: float) -> Step:
    lock = threading.Lock()
    started = time.monotonic()
    state = {"done": 0, "last": None}

    def step(text: str = "") -> None:
        with lock:
            state["done"] += 1
            done, now = state["done"], time.monotonic()
            last = state["last"]
            due = now - started >= delay_s and (last is None or now - last >= every_s)
            if due or (done == total and last is not None):
                state["last"] = now
                log.info("%s: %d/%s%s", desc, done, plural(total, unit), f" ({text})" if text else "")

    return step


def announce(message: str) -> None:
    """`message` at INFO on the package's logger, and on stderr too where logging is not set up (no handler on the
    logger's path) and the logger was not silenced (a level above INFO set on it, or `logging.disable`): a flush that
    makes training wait says so once, where a training script shows it. A script that set up logging gets the record
    where its logging sends INFO (or not at all, at WARNING)."""
    log.info(message)
    silenced = log.level > logging.INFO or log.disabled or logging.root.manager.disable >= logging.INFO
    if not log.hasHandlers() and not silenced:
        print(message, file=sys.stderr, flush=True)
