"""The decoder skeleton, written once: embedding, a stack of residual layers, final norm, head.

A family subclasses ``StackedDecoder`` and states only what differs from it:
how one layer is built (``build_layer``), which norm it uses (``build_norm``),
the geometry its cache sees (``kv_geometry``), its mask and RoPE plans, and,
where it has one, another embedding or head (Gemma 3 overrides ``embed`` and
``final``). The pieces most layers are made of sit here too:
``GroupedQueryAttention`` (q/k/v/o projections, separate or fused, optional
per-head q/k norms) and ``PreNormLayer`` (the Llama-style residual block).

Module names are checkpoint names (``embed_tokens``, ``layers.{i}.self_attn.q_proj``,
``norm``, ``lm_head``), so every family keeps the parameter names its
checkpoints and its transformers twin use.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch
from torch import nn

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.layers import RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import MaskPlan
from fuelpipe.rope import RopePlan

NormFactory = Callable[[int], nn.Module]  # dim -> a norm over the last dim of that width


class GroupedQueryAttention(nn.Module):
    """GQA around ``cached_attention``: project q/k/v, norm q and k per head if asked, RoPE, attend, project out.

    ``fused_qkv``: one ``qkv_proj`` (q | k | v rows, Phi-3's checkpoint layout) instead of
    ``q_proj``/``k_proj``/``v_proj``. ``qk_norm``: builds ``q_norm``/``k_norm`` over head_dim (Qwen3, Gemma 3).
    ``scale`` defaults to head_dim ** -0.5. ``project`` is the one method a variant may override.
    """

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, *, bias: bool = False,
                 scale: Optional[float] = None, fused_qkv: bool = False, qk_norm: Optional[NormFactory] = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.split = (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)  # q | k | v widths
        self.fused_qkv = fused_qkv
        kw = dict(bias=bias, device=device, dtype=dtype)
        if fused_qkv:
            self.qkv_proj = nn.Linear(hidden, sum(self.split), **kw)
        else:
            self.q_proj = nn.Linear(hidden, self.split[0], **kw)
            self.k_proj = nn.Linear(hidden, self.split[1], **kw)
            self.v_proj = nn.Linear(hidden, self.split[2], **kw)
        self.o_proj = nn.Linear(self.split[0], hidden, **kw)
        self.has_qk_norm = qk_norm is not None
        if qk_norm is not None:
            self.q_norm = qk_norm(head_dim)  # over head_dim, per head
            self.k_norm = qk_norm(head_dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> q [B, T, H*D], k [B, T, Hkv*D], v [B, T, Hkv*D]."""
        if self.fused_qkv:
            return self.qkv_proj(x).split(self.split, dim=-1)
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        q, k, v = self.project(x)
        q = split_heads(q, self.n_heads, self.head_dim)  # [B, H, T, D]
        k = split_heads(k, self.n_kv_heads, self.head_dim)  # [B, Hkv, T, D]
        v = split_heads(v, self.n_kv_heads, self.head_dim)  # [B, Hkv, T, D]
        if self.has_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, rotary_dim, self.head_dim)))


class PreNormLayer(nn.Module):
    """h + attn(norm(h)), then h + mlp(norm(h)). ``attn`` takes (x, inputs, rotary_dim); ``mlp`` takes x."""

    def __init__(self, hidden: int, norm: NormFactory, attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = norm(hidden)
        self.self_attn = attn
        self.post_attention_layernorm = norm(hidden)
        self.mlp = mlp

    def forward(self, h: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), inputs, rotary_dim)
        return h + self.mlp(self.post_attention_layernorm(h))


class StackedDecoder(DecoderModel):
    """embed_tokens -> layers -> norm -> lm_head (tied to the embedding when the config says so).

    The config must carry ``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``max_position_embeddings`` and ``rms_norm_eps`` (the
    default norm) and ``tie_word_embeddings`` (the default ``ties_head``).
    """

    # False: no lm_head parameter; the logits come from the embedding table (the family overrides ``final``).
    has_lm_head: bool = True

    def __init__(self, config, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)  # [V, hidden]
        norm = partial(self.build_norm, device=device, dtype=dtype)
        self.layers = nn.ModuleList(self.build_layer(i, norm, device, dtype) for i in range(c.num_hidden_layers))
        self.norm = norm(c.hidden_size)
        if self.has_lm_head:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, device=device, dtype=dtype)
            if self.ties_head():
                self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)
        n_kv_heads, head_dim = self.kv_geometry()
        self.dims = DecodeDims(
            n_layers=c.num_hidden_layers, hidden_size=c.hidden_size, n_heads=c.num_attention_heads,
            n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=c.vocab_size,
            max_position_embeddings=c.max_position_embeddings,
        )
        self.mask_plan = self.build_mask_plan()
        self.rope_plan = self.build_rope_plan()

    # ---- what a family states -------------------------------------------------------------
    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> nn.Module:
        """Layer ``index``, called as layer(h, inputs, rotary_dim); ``norm(dim)`` builds the family's norm."""
        raise NotImplementedError(f"{type(self).__name__} must build its layers (build_layer)")

    def build_norm(self, dim: int, *, device, dtype) -> nn.Module:
        return RMSNorm(dim, self.config.rms_norm_eps, device=device, dtype=dtype)

    def ties_head(self) -> bool:
        """Whether lm_head shares the embedding's storage."""
        return self.config.tie_word_embeddings

    def kv_geometry(self) -> tuple[int, int]:
        """(n_kv_heads, head_dim) as the decode path sizes the cache."""
        return self.config.num_key_value_heads, self.config.head_dim

    def build_mask_plan(self) -> MaskPlan:
        return MaskPlan.full(self.config.num_hidden_layers)

    def build_rope_plan(self) -> RopePlan:
        raise NotImplementedError(f"{type(self).__name__} must state its RoPE plan (build_rope_plan)")

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)  # [B, T, hidden]

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        # The rotated width is read from the RoPE plan, the same data that sized the cos/sin rows.
        return self.layers[index](h, inputs, self.rope_plan.rotary_dim)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))  # [B, T, V]
