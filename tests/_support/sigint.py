"""Ctrl-C as a terminal delivers it, whatever the test run inherited.

A job started in the background by a non-interactive shell (``nohup cmd &``, some CI runners) starts with
SIGINT ignored, and Python then installs no ``KeyboardInterrupt`` handler: a test that presses Ctrl-C would
see nothing happen. These restore what an interactive start has.
"""
from __future__ import annotations

import contextlib
import signal


def default_sigint() -> None:
    """``preexec_fn`` for a child Python: SIGINT at its default, so Python installs its own handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def python_sigint_handler():
    """This process raises ``KeyboardInterrupt`` on SIGINT inside the block (restored after)."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
