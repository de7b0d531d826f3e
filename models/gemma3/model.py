"""Gemma 3 (text) decoder for cached decode.

Against Llama: the embedding is scaled by sqrt(hidden) (rounded to the model
dtype first), every RMS norm scales by (1 + w), each sub-block is wrapped in
a pre- and a post-norm, q and k are RMS-normed per head, the MLP is GeGLU
(tanh GELU), the attention scale is ``query_pre_attn_scalar ** -0.5``, the
head is tied to the embedding, and the final logits may be soft-capped.
Local vs global layers differ only in data: each layer's mask variant and
RoPE spec are picked by the shared step from ``mask_plan`` and ``rope_plan``.
"""
from __future__ import annotations

import torch

from fuelpipe.backbone import LayerInputs
from fuelpipe.decoder_skeleton import GroupedQueryAttention, NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.layers import GatedMLP, RMSNorm
from fuelpipe.masks import SLIDING, MaskPlan
from fuelpipe.quant.modules import embedding_head
from fuelpipe.rope import RopePlan, RopeSpec
from models.gemma3.config import ROPE_FIELDS, Gemma3Config

LOCAL_SPEC, GLOBAL_SPEC = 0, 1  # indices into the RoPE plan's specs


class SandwichNormLayer(PreNormLayer):
    """Each sub-block between a pre- and a post-norm; ``post_attention_layernorm`` wraps attention's output."""

    def __init__(self, hidden: int, norm: NormFactory, attn, mlp) -> None:
        super().__init__(hidden, norm, attn, mlp)
        self.pre_feedforward_layernorm = norm(hidden)
        self.post_feedforward_layernorm = norm(hidden)

    def forward(self, h: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), inputs, rotary_dim))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


def gemma3_rope_plan(c: Gemma3Config) -> RopePlan:
    """Two specs, local then global; each layer points at the one of its kind."""
    local = RopeSpec(theta=c.rope_local_base_freq, rotary_dim=c.head_dim)
    global_ = RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim, scaling=c.rope_scaling)
    layer_spec = tuple(LOCAL_SPEC if kind == SLIDING else GLOBAL_SPEC for kind in c.resolved_layer_types)
    return RopePlan(specs=(local, global_), layer_spec=layer_spec)


class Gemma3Model(StackedDecoder):
    family = "gemma3"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"
    has_lm_head = False  # the head is the embedding table (plain or quantized), see final()

    def __init__(self, config: Gemma3Config, *, device=None, dtype=torch.float32) -> None:
        super().__init__(config, device=device, dtype=dtype)
        # sqrt(hidden) is rounded to the model dtype before it scales (bf16: sqrt(3072) -> 55.5).
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype).item()

    def build_norm(self, dim: int, *, device, dtype) -> RMSNorm:
        return RMSNorm(dim, self.config.rms_norm_eps, unit_offset=True, device=device, dtype=dtype)

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> SandwichNormLayer:
        c: Gemma3Config = self.config
        attn = GroupedQueryAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                     scale=c.query_pre_attn_scalar**-0.5, qk_norm=norm, device=device, dtype=dtype)
        mlp = GatedMLP(c.hidden_size, c.intermediate_size, "gelu_tanh", False, device, dtype)
        return SandwichNormLayer(c.hidden_size, norm, attn, mlp)

    def build_mask_plan(self) -> MaskPlan:
        return MaskPlan(self.config.resolved_layer_types, self.config.sliding_window)

    def build_rope_plan(self) -> RopePlan:
        return gemma3_rope_plan(self.config)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids) * self.embed_scale

    def final(self, h: torch.Tensor) -> torch.Tensor:
        logits = embedding_head(self.embed_tokens, self.norm(h))  # tied head (plain or quantized table)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.gemma3.reference import gemma3_reference_logits

        return gemma3_reference_logits(self, token_ids, rope_plan)
