"""The family's oracle reference: the whole sequence in plain math, no cache, no plan, window from the config."""
from __future__ import annotations

import math

import torch

from fuelpipe.masks import allowed
from fuelpipe.rope import RopePlan, rope_tables, rotate_half


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@torch.no_grad()
def reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan, kv_out: list | None = None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32. ``kv_out``: each layer's post-RoPE (k, v), [Hkv, T, D] each."""
    c = model.config
    T, H, Hkv, D = token_ids.shape[1], c.num_attention_heads, c.num_key_value_heads, c.head_dim
    cos_t, sin_t = rope_tables(rope_plan, T)
    dtype = model.embed_tokens.weight.dtype
    pos = torch.arange(T)
    visible = allowed(pos, pos, c.sliding_window)  # [T, T] causal and within the window, from the config
    x = model.embed_tokens.weight[token_ids[0]]  # [T, hidden]
    for i, layer in enumerate(model.layers):
        cos, sin = cos_t[rope_plan.layer_spec[i]].to(dtype), sin_t[rope_plan.layer_spec[i]].to(dtype)  # [T, D]
        a = layer.self_attn
        h = _rms(x, layer.input_layernorm.weight, c.rms_norm_eps)
        q = a.q_proj(h).view(T, H, D).transpose(0, 1)  # [H, T, D]
        k = a.k_proj(h).view(T, Hkv, D).transpose(0, 1)  # [Hkv, T, D]
        v = a.v_proj(h).view(T, Hkv, D).transpose(0, 1)
        q = q * cos + rotate_half(q, D // 2) * sin
        k = k * cos + rotate_half(k, D // 2) * sin
        if kv_out is not None:
            kv_out.append((k.clone(), v.clone()))
        k, v = k.repeat_interleave(H // Hkv, dim=0), v.repeat_interleave(H // Hkv, dim=0)  # [H, T, D]
        scores = (q.float() @ k.float().transpose(1, 2)) / math.sqrt(D)  # [H, T, T]
        attn = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v.float()  # [H, T, D]
        x = x + a.o_proj(attn.to(dtype).transpose(0, 1).reshape(T, H * D))
        h = _rms(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        m = layer.mlp
        gate = m.gate_proj(h)
        x = x + m.down_proj(gate * torch.sigmoid(gate) * m.up_proj(h))
    x = _rms(x, model.norm.weight, c.rms_norm_eps)
    return (x @ model.lm_head.weight.T).float()[None]
