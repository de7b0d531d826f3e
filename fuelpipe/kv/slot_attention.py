"""Attention of a batch-slot step, as one traced call that a pass can hand to a kernel.

``slot_attention`` is the readable statement: gather each row's slot from the
written buffers, zero every slot its mask hides (``without_masked_slots``), then
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

from fuelpipe.masks import without_masked_slots


def slot_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slot_ids: torch.Tensor,
                   mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, T, D]; k_buf, v_buf [N, Hkv, S, D] (already written); slot_ids [B]; mask [B, 1, T, S] additive.

    Returns [B, H, T, Dv]: row b's queries attend slot ``slot_ids[b]`` under mask row b."""
    keys = without_masked_slots(k_buf.index_select(0, slot_ids), mask, 2)  # [B, Hkv, S, D]
    values = without_masked_slots(v_buf.index_select(0, slot_ids), mask, 2)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)


torch.fx.wrap("slot_attention")


def fast_slot_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slot_ids: torch.Tensor,
                        mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``slot_attention`` through the C++ operator where it applies (float32 on the CPU), else the readable form."""
    if q.device.type == "cpu" and q.dtype == torch.float32 and k_buf.dtype == torch.float32 and mask.dtype == torch.float32:
        return torch.ops.fuelpipe_kernels.slot_attention(q, k_buf, v_buf, slot_ids, mask, scale)
    return slot_attention(q, k_buf, v_buf, slot_ids, mask, scale)
