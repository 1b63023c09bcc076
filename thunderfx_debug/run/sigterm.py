"""A flush on SIGTERM that keeps whatever handled SIGTERM before.

Clusters preempt jobs with SIGTERM (SLURM, Kubernetes, torchrun passing it on to its workers), and launchers and
frameworks install their own handlers (Lightning saves a checkpoint; a SLURM wrapper requeues). `chain_sigterm`
installs a handler that first runs the flush and then exactly what would have run without it: the handler that was
installed before, or the default action (the process ends, killed by SIGTERM, with the usual exit status), or
nothing if SIGTERM was ignored. A handler installed later replaces ours, as Python's handlers always do; it is then
that handler's business to end the process (the flush at interpreter exit still runs if it does so with
`sys.exit`).

Python runs signal handlers in the main thread only, between two of its bytecodes, so the handler is installed only
from the main thread, and never over a handler installed outside Python (`signal.getsignal` returns None for one:
it could not be called afterwards).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("thunderfx_debug")

#: `on_sigterm(then)` flushes and must then call `then()`: the previous handler or the default action.
OnSigterm = Callable[[Callable[[], None]], None]


def chain_sigterm(on_sigterm: OnSigterm) -> bool:
    """Installs the handler (see the module docstring); False, with nothing installed, off the main thread or over
    a handler installed outside Python.

    Example (usage; a doctest would end the interpreter):

        def on_sigterm(then):
            backend.flush()
            then()

        chain_sigterm(on_sigterm)
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:
        log.info("thunderfx_debug: SIGTERM has a handler installed outside Python; no flush at SIGTERM")
        return False

    def handler(signum, frame):
        def then():
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)  # the default action: the process ends, killed by the signal
            # SIG_IGN: the process ignored SIGTERM before; it still does.

        on_sigterm(then)

    signal.signal(signal.SIGTERM, handler)
    return True
