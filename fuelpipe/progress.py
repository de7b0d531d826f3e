"""Progress that shows on a terminal and stays quiet in CI: bars for counted work, a ticking line for waits.

Quiet when ``CI`` is set, when ``FUELPIPE_QUIET`` is set, or when stderr is not a terminal.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator

from tqdm import tqdm

SHOW_AFTER_S = 2.0  # a wait shorter than this prints nothing


def _set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def quiet() -> bool:
    return _set("CI") or _set("FUELPIPE_QUIET") or not sys.stderr.isatty()


def bar(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr, disable=quiet())


@contextlib.contextmanager
def waiting(what: str, expect: str = "") -> Iterator[None]:
    """A wait with no steps to count (a compile, a build): after ``SHOW_AFTER_S`` a line on stderr says
    what is being waited for and for how long, once a second, and ends with the total time."""
    if quiet():
        yield
        return
    done = threading.Event()
    start = time.monotonic()
    shown = []

    def tick() -> None:
        if done.wait(SHOW_AFTER_S):
            return
        while True:
            elapsed = time.monotonic() - start
            sys.stderr.write(f"\r{what}: {elapsed:.0f} s" + (f" ({expect})" if expect else "") + " ")
            sys.stderr.flush()
            shown.append(elapsed)
            if done.wait(1.0):
                return

    ticker = threading.Thread(target=tick, name="fuelpipe-progress", daemon=True)
    ticker.start()
    outcome = "done"
    try:
        yield
    except BaseException:
        outcome = "stopped"
        raise
    finally:
        done.set()
        ticker.join()
        if shown:
            sys.stderr.write(f"\r{what}: {outcome} in {time.monotonic() - start:.0f} s\x1b[K\n")
            sys.stderr.flush()
