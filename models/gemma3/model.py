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
import torch.nn.functional as F
from torch import nn

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.quant.modules import embedding_head
from fuelpipe.layers import GatedMLP, RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import SLIDING, MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from models.gemma3.config import ROPE_FIELDS, Gemma3Config

LOCAL_SPEC, GLOBAL_SPEC = 0, 1  # indices into the RoPE plan's specs


def _norm(dim: int, c: Gemma3Config, device, dtype) -> RMSNorm:
    return RMSNorm(dim, c.rms_norm_eps, unit_offset=True, device=device, dtype=dtype)


class Gemma3Attention(nn.Module):
    def __init__(self, c: Gemma3Config, device=None, dtype=None) -> None:
        super().__init__()
        d = c.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, d
        self.scale = c.query_pre_attn_scalar**-0.5
        kw = dict(bias=False, device=device, dtype=dtype)
        self.q_proj = nn.Linear(c.hidden_size, self.n_heads * d, **kw)
        self.k_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.v_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.o_proj = nn.Linear(self.n_heads * d, c.hidden_size, **kw)
        self.q_norm = _norm(d, c, device, dtype)  # over head_dim, per head
        self.k_norm = _norm(d, c, device, dtype)

    def forward(self, x: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        q = self.q_norm(split_heads(self.q_proj(x), self.n_heads, self.head_dim))  # [1, H, T, D]
        k = self.k_norm(split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim))  # [1, Hkv, T, D]
        v = split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)  # [1, Hkv, T, D]
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, rotary_dim, self.head_dim)))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, c: Gemma3Config, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = _norm(c.hidden_size, c, device, dtype)
        self.self_attn = Gemma3Attention(c, device, dtype)
        self.post_attention_layernorm = _norm(c.hidden_size, c, device, dtype)
        self.pre_feedforward_layernorm = _norm(c.hidden_size, c, device, dtype)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, "gelu_tanh", False, device, dtype)
        self.post_feedforward_layernorm = _norm(c.hidden_size, c, device, dtype)

    def forward(self, h: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), inputs, rotary_dim))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


def gemma3_rope_plan(c: Gemma3Config) -> RopePlan:
    """Two specs, local then global; each layer points at the one of its kind."""
    local = RopeSpec(theta=c.rope_local_base_freq, rotary_dim=c.head_dim)
    global_ = RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim, scaling=c.rope_scaling)
    layer_spec = tuple(LOCAL_SPEC if kind == SLIDING else GLOBAL_SPEC for kind in c.resolved_layer_types)
    return RopePlan(specs=(local, global_), layer_spec=layer_spec)


class Gemma3Model(DecoderModel):
    family = "gemma3"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def __init__(self, config: Gemma3Config, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        # sqrt(hidden) is rounded to the model dtype before it scales (bf16: sqrt(3072) -> 55.5).
        self.embed_scale = torch.tensor(c.hidden_size**0.5, dtype=dtype).item()
        self.layers = nn.ModuleList(Gemma3DecoderLayer(c, device, dtype) for _ in range(c.num_hidden_layers))
        self.norm = _norm(c.hidden_size, c, device, dtype)
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
        self.mask_plan = MaskPlan(c.resolved_layer_types, c.sliding_window)
        self.rope_plan = gemma3_rope_plan(c)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids) * self.embed_scale

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        return self.layers[index](h, inputs, self.rope_plan.rotary_dim)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        logits = embedding_head(self.embed_tokens, self.norm(h))  # tied head (plain or quantized table)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
        from models.gemma3.reference import gemma3_reference_logits

        return gemma3_reference_logits(self, token_ids, rope_plan)
