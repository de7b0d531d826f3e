"""Llama decoder for cached decode: RMSNorm, GQA attention with RoPE, SwiGLU MLP, tied or untied head."""
from __future__ import annotations

import torch
from torch import nn

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.layers import GatedMLP, RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.llama.config import ROPE_FIELDS, LlamaConfig


class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig, device=None, dtype=None) -> None:
        super().__init__()
        d = c.resolved_head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, d
        self.scale = d**-0.5
        self.rotary_dim = d
        kw = dict(bias=c.attention_bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(c.hidden_size, self.n_heads * d, **kw)
        self.k_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.v_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.o_proj = nn.Linear(self.n_heads * d, c.hidden_size, bias=c.attention_bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        q = split_heads(self.q_proj(x), self.n_heads, self.head_dim)  # [1, H, T, D]
        k = split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        v = split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, self.rotary_dim, self.head_dim)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = LlamaAttention(c, device, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", c.mlp_bias, device, dtype)

    def forward(self, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), inputs)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(DecoderModel):
    family = "llama"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"  # the device-offset path (see fuelpipe.kv.views)

    def __init__(self, config: LlamaConfig, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c, device, dtype) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, device=device, dtype=dtype)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)
        self.dims = DecodeDims(
            n_layers=c.num_hidden_layers,
            hidden_size=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads,
            head_dim=c.resolved_head_dim,
            vocab_size=c.vocab_size,
            max_position_embeddings=c.max_position_embeddings,
        )
        self.mask_plan = MaskPlan.full(c.num_hidden_layers)
        self.rope_plan = _rope_plan_of(c)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        return self.layers[index](h, inputs)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None, kv_out=None) -> torch.Tensor:
        from models.llama.reference import llama_reference_logits

        # The oracle derives RoPE from the config, never from self.rope_plan (the decode path's data).
        return llama_reference_logits(self, token_ids, rope_plan or _rope_plan_of(self.config), kv_out)


def _rope_plan_of(c: LlamaConfig) -> RopePlan:
    spec = RopeSpec(theta=c.rope_theta, rotary_dim=c.resolved_head_dim, scaling=c.rope_scaling)
    return RopePlan.uniform(spec, c.num_hidden_layers)
