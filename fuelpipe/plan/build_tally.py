"""Every program this process builds (held decode plans, batch plans, prompt programs), counted and timed.

What a phase or an oracle cost in builds is the tally's difference across it (``since``): the gate
reports each oracle's own builds beside its wall time, so the cost of a check is visible.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Tally:
    builds: int = 0
    seconds: float = 0.0

    def since(self, before: "Tally") -> "Tally":
        return Tally(self.builds - before.builds, self.seconds - before.seconds)


_now = Tally()


def current() -> Tally:
    return _now


@contextmanager
def counted_build() -> Iterator[None]:
    """Count the build inside the block (a build that raises counts too: its time was spent)."""
    global _now
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _now = Tally(_now.builds + 1, _now.seconds + time.perf_counter() - t0)


def add(spent: Tally) -> None:
    """Count builds another process made on this process's behalf (an oracle's worker processes)."""
    global _now
    _now = Tally(_now.builds + spent.builds, _now.seconds + spent.seconds)
