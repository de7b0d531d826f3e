"""Qwen3 decoder for cached decode: Llama's block plus an RMS norm over each head of q and k before RoPE.

Sliding-window layers, when the config selects any, are data: the mask plan
names each layer's kind and the shared step picks that layer's mask row.
"""
from __future__ import annotations

import torch

from fuelpipe.decoder_skeleton import GroupedQueryAttention, NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.layers import GatedMLP
from fuelpipe.masks import MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.qwen3.config import ROPE_FIELDS, Qwen3Config


class Qwen3Model(StackedDecoder):
    family = "qwen3"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> PreNormLayer:
        c: Qwen3Config = self.config
        attn = GroupedQueryAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                     bias=c.attention_bias, qk_norm=norm, device=device, dtype=dtype)
        mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", False, device, dtype)
        return PreNormLayer(c.hidden_size, norm, attn, mlp)

    def build_mask_plan(self) -> MaskPlan:
        return MaskPlan(self.config.resolved_layer_types, self.config.window)

    def build_rope_plan(self) -> RopePlan:
        c = self.config
        return RopePlan.uniform(RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim, scaling=c.rope_scaling),
                                c.num_hidden_layers)

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.qwen3.reference import qwen3_reference_logits

        return qwen3_reference_logits(self, token_ids, rope_plan)
