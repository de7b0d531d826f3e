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

    Key positions ``0 .. width`` beyond the live prefix are always masked. A
    masked slot's score is -inf, but that alone does not make a garbage-filled
    slot harmless: its value row still meets softmax's exact 0, and 0 x NaN is
    NaN. Attention therefore also passes K/V through ``without_masked_slots``.
    """
    q_pos = torch.arange(start, start + seq)
    k_pos = torch.arange(width)
    rows = [allowed(q_pos, k_pos, plan.window_of(kind)) for kind in plan.variants]
    ok = torch.stack(rows)[:, None, None]  # [V, 1, 1, seq, width]
    out = torch.zeros(ok.shape, dtype=dtype)
    return out.masked_fill_(~ok, float("-inf"))


class MaskRowTable:
    """``mask_variants`` for one query (a decode step) at any position, read as a view instead of computed.

    ``allowed`` depends on q - k only, so the row of a query at position p over keys 0 .. W-1 is the window
    [W-1-p, 2W-1-p) of the row of a query at W-1 over keys 0 .. 2W-2: that one row per variant is computed
    once, by ``mask_variants`` itself, and every decode step slices it (no arithmetic per token).
    """

    def __init__(self, plan: MaskPlan, width: int, dtype: torch.dtype) -> None:
        self.plan, self.width, self.dtype = plan, width, dtype
        self.table = mask_variants(plan, width - 1, 1, 2 * width - 1, dtype)  # [V, 1, 1, 1, 2W-1]

    def serves(self, plan: MaskPlan, width: int, dtype: torch.dtype) -> bool:
        return self.width == width and self.dtype == dtype and self.plan == plan

    def row(self, start: int) -> torch.Tensor:
        """[V, 1, 1, 1, W]: ``mask_variants(plan, start, 1, W, dtype)``, a read-only view of the table for a
        query inside the width (0 <= start < W); computed by ``mask_variants`` beyond it."""
        if 0 <= start < self.width:
            return self.table[..., self.width - 1 - start: 2 * self.width - 1 - start]
        return mask_variants(self.plan, start, 1, self.width, self.dtype)


def row_mask_variants(plan: MaskPlan, positions: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive masks [n_variants, B, 1, 1, width] for one query per row, row b at ``positions[b]``.

    The batched step's masks: every row has its own causal limit and sliding window.
    """
    k_pos = torch.arange(width)
    rows = [allowed(positions, k_pos, plan.window_of(kind)) for kind in plan.variants]  # each [B, width]
    ok = torch.stack(rows)[:, :, None, None]  # [V, B, 1, 1, width]
    out = torch.zeros(ok.shape, dtype=dtype)
    return out.masked_fill_(~ok, float("-inf"))


def live_slots(mask: torch.Tensor) -> torch.Tensor:
    """Bool [.., 1, S] from an additive mask [.., T, S]: slots at least one query of the step may attend."""
    return (mask != float("-inf")).any(dim=-2, keepdim=True)


def live_slots_as(mask: torch.Tensor, slot_dim: int) -> torch.Tensor:
    """``live_slots(mask)`` shaped to broadcast against K/V [B, Hkv, S, D] (slot_dim=2) or a latent [B, S, r] (1)."""
    live = live_slots(mask)  # [B, 1, 1, S]
    if slot_dim == 2:
        return live.transpose(-1, -2)  # [B, 1, S, 1]
    if slot_dim == 1:
        return live[:, 0].transpose(-1, -2)  # [B, S, 1]
    raise ValueError(f"without_masked_slots: slot_dim must be 1 or 2, got {slot_dim}")


def without_masked_slots(x: torch.Tensor, mask: torch.Tensor, slot_dim: int) -> torch.Tensor:
    """``x`` with every slot no query may attend set to exactly 0, whatever it held (NaN, Inf, a stale row).

    x: K or V [B, Hkv, S, D] (slot_dim=2) or a latent slot [B, S, r] (slot_dim=1); mask: [B, 1, T, S] additive.
    A recycled paged block, a reused cache, the null block and batch padding all reach attention
    as masked slots; with them zeroed, masked means contributes nothing, NaN included.
    """
    return torch.where(live_slots_as(mask, slot_dim), x, 0.0)
