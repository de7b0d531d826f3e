"""Phi (Phi-3 architecture) decoder for cached decode.

Differs from Llama in three places: one fused ``qkv_proj`` and one fused
``gate_up_proj`` (checkpoint names), RoPE on only the leading
``partial_rotary_factor`` of each head, and an optional sliding window on
every layer. It decodes on the symbol offset path (see ``fuelpipe.kv.views``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fuelpipe.decoder_skeleton import GroupedQueryAttention, NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.masks import FULL, SLIDING, MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.phi.config import ROPE_FIELDS, PhiConfig


class PhiMLP(nn.Module):
    """down(silu(gate) * up), gate and up computed by one fused projection (gate first)."""

    def __init__(self, c: PhiConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [B, T, I] each
        return self.down_proj(F.silu(gate) * up)


class PhiModel(StackedDecoder):
    family = "phi"
    rope_fields = ROPE_FIELDS
    offset_mode = "symbol"  # the symbol path: write offset and live length are per-pass host ints

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> PreNormLayer:
        c: PhiConfig = self.config
        attn = GroupedQueryAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                     fused_qkv=True, device=device, dtype=dtype)
        return PreNormLayer(c.hidden_size, norm, attn, PhiMLP(c, device, dtype))

    def build_mask_plan(self) -> MaskPlan:
        c = self.config
        kind = FULL if c.sliding_window is None else SLIDING
        return MaskPlan((kind,) * c.num_hidden_layers, c.sliding_window)

    def build_rope_plan(self) -> RopePlan:
        # Partial rotary: the plan rotates only the leading rotary_dim of each head.
        c = self.config
        return RopePlan.uniform(RopeSpec(theta=c.rope_theta, rotary_dim=c.rotary_dim), c.num_hidden_layers)

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.phi.reference import phi_reference_logits

        return phi_reference_logits(self, token_ids, rope_plan)
