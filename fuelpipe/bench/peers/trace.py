"""What one timed generation records, and the clock every system is read with.

Every system is timed the same way: the clock starts when generation is asked
for and is read each time a new token id becomes known to the caller (after
sampling). ``first_token_ms`` is therefore prompt processing plus the first
sample; ``step_ms`` are the gaps between successive tokens, one decode step
each, with each system's own loop overhead included.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RunTrace:
    tokens: list[int] = field(default_factory=list)
    first_token_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)


class TokenClock:
    """Collects token ids and their arrival times; call ``start()`` right before generating."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._stamps: list[float] = []
        self.tokens: list[int] = []

    def start(self) -> None:
        self._stamps, self.tokens = [], []
        self._t0 = time.perf_counter()

    def token(self, token_id: int) -> None:
        self._stamps.append(time.perf_counter())
        self.tokens.append(int(token_id))

    def trace(self) -> RunTrace:
        s = self._stamps
        steps = [1000.0 * (b - a) for a, b in zip(s, s[1:])]
        return RunTrace(list(self.tokens), 1000.0 * (s[0] - self._t0) if s else 0.0, steps)
