"""Faults planted in code that every fuelpipe path shares, for the duration of one negative control.

Most faults are switches the driver reads for one context. A bug in shared
code (``fuelpipe.rope``'s frequency math) reaches the decode path *and* each
family's own no-cache reference at once, which is exactly why ``vs_reference``
cannot see it and only an external reference can. ``planted(fault)`` swaps
the shared function for its faulty twin inside a ``with`` block and restores
it on exit; outside a negative control it does nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

from fuelpipe.oracles.faults import Fault
from fuelpipe.rope import RopeSpec

_CORRECT_INV_FREQ = RopeSpec.inv_freq


def _inv_freq_exponent_stepped_by_one(spec: RopeSpec) -> torch.Tensor:
    """[rotary_dim / 2] theta ** -(i / d) for i < d/2 (the bug: the exponent steps by 1, not 2), scaling applied."""
    doubled = dataclasses.replace(spec, rotary_dim=2 * spec.rotary_dim)  # its exponents are 2i / 2d = i / d
    return _CORRECT_INV_FREQ(doubled)[: spec.rotary_dim // 2]


@contextlib.contextmanager
def planted(fault: Fault) -> Iterator[None]:
    """Run the block with ``fault`` planted in shared code (a no-op for every other fault)."""
    if fault is not Fault.ROPE_FREQ_EXPONENT:
        yield
        return
    RopeSpec.inv_freq = _inv_freq_exponent_stepped_by_one
    try:
        yield
    finally:
        RopeSpec.inv_freq = _CORRECT_INV_FREQ
