"""Refuse non-finite checkpoint tensors at load: one vectorised reduction per tensor, details only on failure.

The fast path is a sum: IEEE arithmetic carries any NaN or Inf into it, so a finite sum proves every
element finite. A non-finite sum is either a real NaN/Inf or finite values whose sum overflowed;
``torch.isfinite`` then decides exactly (no false alarm, no miss).

Measured on SmolLM2-135M (134.5M parameters, 2 threads, a shared 2-core VM): ``torch.isfinite(t).all()``
on every tensor costs 3.0-3.7 s, ``t.sum()`` 0.2-0.4 s back to back but 1.0-1.5 s inside the load,
where each call wakes torch's worker threads between single-threaded dequantizations; numpy's
single-threaded SIMD sum costs 0.1-0.2 s there, on a 1.2-2.2 s load. CPU float16/32/64 tensors
(every dequantized GGUF tensor) take the numpy sum; others (bfloat16, other devices) torch's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fuelpipe.weights.errors import NonFiniteWeightError

_NUMPY_SUMMED = (torch.float16, torch.float32, torch.float64)


def _sum_is_finite(t: torch.Tensor) -> bool:
    if t.device.type == "cpu" and t.dtype in _NUMPY_SUMMED:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow and inf - inf are answers here, not warnings
            return bool(np.isfinite(t.detach().numpy().sum()))
    return bool(torch.isfinite(t.sum()))


def check_finite(path: Path, name: str, t: torch.Tensor) -> None:
    """Raise ``NonFiniteWeightError`` naming ``name`` when ``t`` holds a NaN or an Inf."""
    if not t.is_floating_point() or _sum_is_finite(t):
        return
    bad = ~torch.isfinite(t)  # the exact check, on the rare path only
    count = int(bad.sum())
    if count == 0:  # finite values whose sum overflowed
        return
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    first = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))
    raise NonFiniteWeightError(path, name, count, t.numel(), first, float(t.reshape(-1)[flat]))
