"""Freed large blocks go back to the operating system: glibc's mmap threshold, fixed.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at
start) with its own ``mmap``, returned to the OS when freed. But the threshold
is dynamic: freeing such a block raises it to that block's size (up to 32 MiB),
and every later allocation below it comes from the heap, whose freed pages
stay resident. A plan build allocates and frees hundreds of MiB in blocks of a
few MiB (fused weight copies, the forms ``measured_linears`` times, packing
temporaries), so after the build the process keeps them: measured on SmolLM2
f32 (``fuelpipe experiment=generate``'s phases), the steady decode RSS was
1733 MB with the dynamic threshold and 1344 MB with it fixed at 1 MiB, at the
same decode speed. ``mallopt(M_MMAP_THRESHOLD, n)`` fixes it (and turns the
dynamic raise off); blocks of 1 MiB and more are then mapped and unmapped
each time.

The job (``fuelpipe.runner.job``) applies it at its start; a library user may
call :func:`return_large_frees_to_os` once. A ``MALLOC_MMAP_THRESHOLD_`` set in
the environment is the user's own choice and is left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

MMAP_THRESHOLD = 1 << 20  # bytes: every block of at least 1 MiB is its own mapping, unmapped when freed
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
_APPLIED: list[str] = []


def return_large_frees_to_os(threshold: int = MMAP_THRESHOLD) -> str:
    """Fix glibc's mmap threshold at ``threshold`` bytes; returns what was done, in words.

    ``"mmap threshold <n> bytes"`` when set; otherwise why not (another C library, another OS,
    the environment's own ``MALLOC_MMAP_THRESHOLD_``). Idempotent per process."""
    if not isinstance(threshold, int) or not 0 < threshold <= 32 << 20:
        raise ValueError(f"the mmap threshold must be an int in (0, 32 MiB], got {threshold!r}")
    if _APPLIED:
        return _APPLIED[0]
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        status = f"left to the environment (MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']})"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        status = f"not applied: {platform.system()} {platform.libc_ver()[0] or 'without glibc'}"
    else:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, threshold)
        status = f"mmap threshold {threshold} bytes" if ok == 1 else "not applied: mallopt refused"
    _APPLIED.append(status)
    return status
