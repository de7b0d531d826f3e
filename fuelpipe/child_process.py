"""What a helper process fuelpipe starts does first, so it never outlives the process that needs it."""
from __future__ import annotations

import contextlib
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
# Set only while a pool starts its workers: the interpreters started then ignore SIGINT from their first
# import of fuelpipe on (``ignore_sigint_if_asked``), before the seconds their imports take on a loaded machine.
WORKER_IGNORES_SIGINT = "FUELPIPE_WORKER_IGNORES_SIGINT"


def die_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        import ctypes  # here: ``import fuelpipe`` reads this module first thing and stays light

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def ignore_sigint_if_asked() -> None:
    """At ``import fuelpipe``: a worker started under ``workers_ignore_sigint`` ignores SIGINT. Such a worker
    is born in its parent's process group, so a terminal's Ctrl-C reaches it until it leads a group of its
    own; the parent stops it and its group itself, and a ``KeyboardInterrupt`` traceback from its start-up
    imports would only be noise on the terminal."""
    if os.environ.get(WORKER_IGNORES_SIGINT) == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def workers_ignore_sigint():
    """The Python processes started in this block ignore SIGINT from their first ``import fuelpipe`` on (the
    variable is inherited at their start and removed here after)."""
    before = os.environ.get(WORKER_IGNORES_SIGINT)
    os.environ[WORKER_IGNORES_SIGINT] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WORKER_IGNORES_SIGINT, None)
        else:
            os.environ[WORKER_IGNORES_SIGINT] = before
