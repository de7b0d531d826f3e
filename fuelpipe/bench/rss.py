"""Resident memory per phase (load, build, decode): each phase's own peak, not only the process's.

Each phase resets the peak (``fuelpipe.resident_memory.reset_peak``), so it
starts from the memory it inherits and its peak is its own. Where that is not
possible, every phase reports the lifetime peak so far and says so
(``peak_resets: false``). One reset serves one measurement at a time:
``bench_peers`` resets the peak per row inside the main job's ``checks``
phase, whose peak then covers only what followed the last row.
"""
from __future__ import annotations

from typing import Optional

from fuelpipe.resident_memory import current_mb, peak_mb, reset_peak


class PhasePeaks:
    """``start(name)`` ends the running phase (recording its peak) and begins the next; ``stop()`` ends the last.

    ``phases[name]`` = {"start_mb": resident at its start, "peak_mb": its peak, "end_mb": resident at its end}.
    """

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self.peak_resets = True
        self._name: Optional[str] = None
        self._carried = 0.0  # the running phase's peak before its last part began

    def start(self, name: str) -> None:
        self.stop()
        self.peak_resets = reset_peak() and self.peak_resets
        self._name = name
        self._carried = 0.0
        self.phases[name] = {"start_mb": current_mb()}

    def stop(self) -> None:
        if self._name is not None:
            self.phases[self._name].update(peak_mb=max(peak_mb(), self._carried), end_mb=current_mb())
            self._name = None

    def part(self) -> None:
        """Begin a part of the running phase (one oracle of the checks): its own peak is ``part_peak()`` at
        its end, and the phase's peak still covers every part."""
        self._carried = max(self._carried, peak_mb())
        self.peak_resets = reset_peak() and self.peak_resets

    def part_peak(self) -> float:
        """The peak resident set since the running part began (the phase's, where peaks cannot be reset)."""
        return peak_mb()

    def report(self) -> dict:
        self.stop()
        return {"phases": self.phases, "peak_resets": self.peak_resets}
