"""Llama decoder for cached decode: RMSNorm, GQA attention with RoPE, SwiGLU MLP, tied or untied head.

The skeleton (embedding, pre-norm layers, final norm, head) is ``fuelpipe.decoder_skeleton``;
Llama is that skeleton as it stands, with biases where the config asks for them.
"""
from __future__ import annotations

import torch

from fuelpipe.decoder_skeleton import GroupedQueryAttention, NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.layers import GatedMLP
from fuelpipe.rope import RopePlan, RopeSpec
from models.llama.config import ROPE_FIELDS, LlamaConfig


class LlamaModel(StackedDecoder):
    family = "llama"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"  # the device-offset path (see fuelpipe.kv.views)

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> PreNormLayer:
        c: LlamaConfig = self.config
        attn = GroupedQueryAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.resolved_head_dim,
                                     bias=c.attention_bias, device=device, dtype=dtype)
        mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", c.mlp_bias, device, dtype)
        return PreNormLayer(c.hidden_size, norm, attn, mlp)

    def kv_geometry(self) -> tuple[int, int]:
        return self.config.num_key_value_heads, self.config.resolved_head_dim

    def build_rope_plan(self) -> RopePlan:
        return _rope_plan_of(self.config)

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None, kv_out=None) -> torch.Tensor:
        from models.llama.reference import llama_reference_logits

        # The oracle derives RoPE from the config, never from self.rope_plan (the decode path's data).
        return llama_reference_logits(self, token_ids, rope_plan or _rope_plan_of(self.config), kv_out)


def _rope_plan_of(c: LlamaConfig) -> RopePlan:
    spec = RopeSpec(theta=c.rope_theta, rotary_dim=c.resolved_head_dim, scaling=c.rope_scaling)
    return RopePlan.uniform(spec, c.num_hidden_layers)
