"""Qwen3 decoder for cached decode: Llama's block plus an RMS norm over each head of q and k before RoPE.

Sliding-window layers, when the config selects any, are data: the mask plan
names each layer's kind and the shared step picks that layer's mask row.
"""
from __future__ import annotations

import torch
from torch import nn

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.layers import GatedMLP, RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.qwen3.config import ROPE_FIELDS, Qwen3Config


class Qwen3Attention(nn.Module):
    def __init__(self, c: Qwen3Config, device=None, dtype=None) -> None:
        super().__init__()
        d = c.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, d
        self.scale = d**-0.5
        kw = dict(bias=c.attention_bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(c.hidden_size, self.n_heads * d, **kw)
        self.k_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.v_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.o_proj = nn.Linear(self.n_heads * d, c.hidden_size, **kw)
        self.q_norm = RMSNorm(d, c.rms_norm_eps, device=device, dtype=dtype)  # over head_dim, per head
        self.k_norm = RMSNorm(d, c.rms_norm_eps, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        q = self.q_norm(split_heads(self.q_proj(x), self.n_heads, self.head_dim))  # [1, H, T, D]
        k = self.k_norm(split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim))  # [1, Hkv, T, D]
        v = split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, rotary_dim, self.head_dim)))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, c: Qwen3Config, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = Qwen3Attention(c, device, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", False, device, dtype)

    def forward(self, h: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), inputs, rotary_dim)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Model(DecoderModel):
    family = "qwen3"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def __init__(self, config: Qwen3Config, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(c, device, dtype) for _ in range(c.num_hidden_layers))
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
            head_dim=c.head_dim,
            vocab_size=c.vocab_size,
            max_position_embeddings=c.max_position_embeddings,
        )
        self.mask_plan = MaskPlan(c.resolved_layer_types, c.window)
        spec = RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim, scaling=c.rope_scaling)
        self.rope_plan = RopePlan.uniform(spec, c.num_hidden_layers)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        return self.layers[index](h, inputs, self.rope_plan.rotary_dim)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.qwen3.reference import qwen3_reference_logits

        return qwen3_reference_logits(self, token_ids, rope_plan)
