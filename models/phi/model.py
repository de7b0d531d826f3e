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

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.layers import RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import FULL, SLIDING, MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.phi.config import ROPE_FIELDS, PhiConfig


class PhiAttention(nn.Module):
    def __init__(self, c: PhiConfig, device=None, dtype=None) -> None:
        super().__init__()
        d = c.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, d
        self.scale = d**-0.5
        self.split = (self.n_heads * d, self.n_kv_heads * d, self.n_kv_heads * d)  # q | k | v
        self.qkv_proj = nn.Linear(c.hidden_size, sum(self.split), bias=False, device=device, dtype=dtype)
        self.o_proj = nn.Linear(self.n_heads * d, c.hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = split_heads(q, self.n_heads, self.head_dim)  # [1, H, T, D]
        k = split_heads(k, self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        v = split_heads(v, self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, rotary_dim, self.head_dim)))


class PhiMLP(nn.Module):
    """down(silu(gate) * up), gate and up computed by one fused projection (gate first)."""

    def __init__(self, c: PhiConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class PhiDecoderLayer(nn.Module):
    def __init__(self, c: PhiConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = PhiAttention(c, device, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = PhiMLP(c, device, dtype)

    def forward(self, h: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), inputs, rotary_dim)
        return h + self.mlp(self.post_attention_layernorm(h))


class PhiModel(DecoderModel):
    family = "phi"
    rope_fields = ROPE_FIELDS
    offset_mode = "symbol"  # the symbol path: write offset and live length are per-pass host ints

    def __init__(self, config: PhiConfig, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(PhiDecoderLayer(c, device, dtype) for _ in range(c.num_hidden_layers))
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
        kind = FULL if c.sliding_window is None else SLIDING
        self.mask_plan = MaskPlan((kind,) * c.num_hidden_layers, c.sliding_window)
        self.rope_plan = RopePlan.uniform(RopeSpec(theta=c.rope_theta, rotary_dim=c.rotary_dim), c.num_hidden_layers)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        # The rotated width is read from the RoPE plan, the same data that sized the cos/sin rows.
        return self.layers[index](h, inputs, self.rope_plan.rotary_dim)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.phi.reference import phi_reference_logits

        return phi_reference_logits(self, token_ids, rope_plan)
