"""The CLI's first lines, before torch and Hydra import: a Ctrl-C in those seconds is a clean stop.

Both ``fuelpipe`` (the console script) and ``python -m fuelpipe`` start here. SIGINT gets a handler that
remembers the press as well as raising ``KeyboardInterrupt``: Python drops an exception raised inside a
weakref callback or a ``__del__`` ("Exception ignored in ..."), and the import machinery runs such
callbacks (seen in CI: the press was lost in ``_get_module_lock``'s callback and the whole job ran).
Whatever swallowed the raise, the remembered press still stops the run before it starts.
"""
from __future__ import annotations

import os
import signal
import sys

_pressed = False
INTERRUPTED_EXIT = 130  # the shell's 128 + SIGINT; fuelpipe.results.EXIT_CODES says the same (not imported: torch)


def _on_sigint(signum, frame) -> None:
    global _pressed
    _pressed = True
    raise KeyboardInterrupt


def sigint_pressed() -> bool:
    """Whether Ctrl-C was pressed since the CLI started, even if the ``KeyboardInterrupt`` it raised was lost."""
    return _pressed


def _nothing_ran() -> None:
    print("fuelpipe: interrupted (Ctrl-C) while starting; nothing ran", file=sys.stderr, flush=True)
    # os._exit, not sys.exit: a half-imported torch's exit handlers must not run (seen: the process then
    # died of SIGINT instead of exiting 130), and nothing else ran that could need them
    os._exit(INTERRUPTED_EXIT)


def main() -> None:
    signal.signal(signal.SIGINT, _on_sigint)  # raises as Python's own handler does, and remembers
    try:
        from fuelpipe.cli import main as cli_main
    except KeyboardInterrupt:
        _nothing_ran()
    if _pressed:  # the raise was swallowed on the way
        _nothing_ran()
    cli_main()
