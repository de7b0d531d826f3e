"""The process's resident memory now and its peak, in MB; the peak can be reset (Linux).

A process's lifetime peak (``ru_maxrss``) cannot say which phase set it. On
Linux the peak (``VmHWM``) can be reset by writing 5 to
``/proc/self/clear_refs``, so a measurement (a checkpoint load, a benchmark
phase) can start from the memory it inherits and read a peak of its own.
Where that is not possible, ``reset_peak`` says so and the peak stays the
lifetime peak so far. One reset serves one measurement at a time.

A leaf: the loader (``fuelpipe.weights``) and the benchmarks
(``fuelpipe.bench.rss``) both read memory here.
"""
from __future__ import annotations

import re
from pathlib import Path

import psutil

MB = 1024 * 1024
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def current_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_mb() -> float:
    """The peak resident set since the last reset (VmHWM), or since the start where there is none."""
    try:
        m = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
        if m:
            return int(m.group(1)) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def reset_peak() -> bool:
    """Start a new peak from the current resident set; False where the OS does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False
