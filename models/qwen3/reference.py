"""The Qwen3 oracle: a readable full-sequence forward with no cache, no plan, no fused kernels.

Each layer's window is read from the config's layer kinds, never from the
model's ``mask_plan``; RoPE rows come from the config unless a plan is passed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fuelpipe.masks import SLIDING
from fuelpipe.rope import RopePlan
from models.reference_ops import attend, heads, rms_norm, rope_rows, rotate, rows_from_plan


def _linear(x: torch.Tensor, lin) -> torch.Tensor:
    y = x @ lin.weight.T
    return y if lin.bias is None else y + lin.bias


@torch.no_grad()
def qwen3_reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32."""
    c = model.config
    T = token_ids.shape[1]
    H, Hkv, D, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    cos, sin = rope_rows(c.rope_theta, D, c.rope_scaling, T)
    x = model.embed_tokens.weight[token_ids[0]]  # [T, hidden]
    for i, layer in enumerate(model.layers):
        if rope_plan is not None:
            cos, sin = rows_from_plan(rope_plan, i, T)
        window = c.window if c.resolved_layer_types[i] == SLIDING else None
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, eps)
        q = rms_norm(heads(_linear(h, a.q_proj), H, D), a.q_norm.weight, eps)  # [H, T, D], normed per head
        k = rms_norm(heads(_linear(h, a.k_proj), Hkv, D), a.k_norm.weight, eps)  # [Hkv, T, D]
        v = heads(_linear(h, a.v_proj), Hkv, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        x = x + _linear(attend(q, k, v, D**-0.5, window), a.o_proj)
        h = rms_norm(x, layer.post_attention_layernorm.weight, eps)
        m = layer.mlp
        x = x + (F.silu(h @ m.gate_proj.weight.T) * (h @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    x = rms_norm(x, model.norm.weight, eps)
    return (x @ model.lm_head.weight.T).float()[None]
