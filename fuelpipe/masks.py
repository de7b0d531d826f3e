"""Per-layer attention-mask plan: which layers attend fully and which through a window.

Variation is data: ``layer_types`` names each layer's kind, and the mask
variant index of a layer is derived from it. One host function computes the
stacked variants for a step; the program selects each layer's row by index.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fuelpipe.errors import ConfigError

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)


@dataclass(frozen=True)
class MaskPlan:
    layer_types: tuple[str, ...]
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        unknown = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if unknown:
            raise ConfigError(f"unknown layer_types {unknown}; available: {list(LAYER_TYPES)}")
        if SLIDING in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise ConfigError(
                f"sliding_attention layers need sliding_window >= 1, got {self.sliding_window}"
            )

    @classmethod
    def full(cls, n_layers: int) -> "MaskPlan":
        return cls(layer_types=(FULL,) * n_layers)

    @property
    def variants(self) -> tuple[str, ...]:
        """Distinct layer kinds in first-seen order: the stacked mask's leading axis."""
        return tuple(dict.fromkeys(self.layer_types))

    @property
    def layer_variant(self) -> tuple[int, ...]:
        index = {kind: i for i, kind in enumerate(self.variants)}
        return tuple(index[t] for t in self.layer_types)

    def window_of(self, kind: str) -> int | None:
        return self.sliding_window if kind == SLIDING else None


def allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Bool [Tq, Tk]: causal, and within the last ``window`` positions when windowed."""
    ok = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        ok = ok & (q_pos[:, None] - k_pos[None, :] < window)
    return ok


def mask_variants(plan: MaskPlan, start: int, seq: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive masks [n_variants, 1, 1, seq, width] for queries at ``start .. start+seq``.

    Key positions ``0 .. width`` beyond the live prefix are always masked, so a
    zero-filled (or garbage-filled) tail of the cache never contributes.
    """
    q_pos = torch.arange(start, start + seq)
    k_pos = torch.arange(width)
    rows = [allowed(q_pos, k_pos, plan.window_of(kind)) for kind in plan.variants]
    ok = torch.stack(rows)[:, None, None]  # [V, 1, 1, seq, width]
    out = torch.zeros(ok.shape, dtype=dtype)
    return out.masked_fill_(~ok, float("-inf"))
