"""Attention of a batch-slot step, as one traced call that a pass can hand to a kernel.

``slot_attention`` is the readable statement: gather each row's slot from the
written buffers, zero every slot no query of its row may attend, then
scaled-dot-product attention. It is an fx leaf (``torch.fx.wrap``), so a traced
batch step holds it as one node, and the ``slot_attention_kernel`` fx pass
(``fuelpipe.plan.fx_passes``) swaps that node for ``fast_slot_attention``: the C++
operator ``fuelpipe_kernels::slot_attention`` (``fuelpipe/kernels/slot_attention.cpp``),
which reads each row's keys and values in place and never reads a masked slot.
Without the pass (or off the CPU, or in another dtype) the readable form runs.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

from fuelpipe.masks import live_slots_as


def slot_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slot_ids: torch.Tensor,
                   mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, T, D]; k_buf, v_buf [N, Hkv, S, D] (already written); slot_ids [B]; mask [B, 1, T, S] additive.

    Returns [B, H, T, Dv]: row b's queries attend slot ``slot_ids[b]`` under mask row b."""
    live = live_slots_as(mask, 2)  # [B, 1, S, 1]: the slots some query of the row may attend
    keys = torch.where(live, k_buf.index_select(0, slot_ids), 0.0)  # [B, Hkv, S, D]
    values = torch.where(live, v_buf.index_select(0, slot_ids), 0.0)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)


torch.fx.wrap("slot_attention")


def fast_slot_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slot_ids: torch.Tensor,
                        mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``slot_attention`` through the C++ operator where it applies (float32 on the CPU), else the readable form."""
    floats = (q, k_buf, v_buf, mask)
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in floats) and slot_ids.device.type == "cpu":
        return torch.ops.fuelpipe_kernels.slot_attention(q, k_buf, v_buf, slot_ids, mask, scale)
    return slot_attention(q, k_buf, v_buf, slot_ids, mask, scale)
