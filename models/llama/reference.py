"""The Llama oracle: a readable full-sequence forward with no cache, no plan, no fused kernels."""
from __future__ import annotations

import math

import torch

from fuelpipe.masks import allowed
from fuelpipe.rope import RopePlan, rope_tables, rotate_half


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x, x.shape[-1] // 2) * sin


@torch.no_grad()
def llama_reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan, kv_out: list | None = None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32, in plain math over the whole sequence.

    When ``kv_out`` is a list, each layer's post-RoPE keys and values ([Hkv, T, D] each) are appended.
    """
    c = model.config
    T = token_ids.shape[1]
    H, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.resolved_head_dim
    group = H // Hkv
    cos_t, sin_t = rope_tables(rope_plan, T)
    dtype = model.embed_tokens.weight.dtype
    pos = torch.arange(T)
    x = model.embed_tokens.weight[token_ids[0]]  # [T, hidden]
    for i, layer in enumerate(model.layers):
        cos = cos_t[rope_plan.layer_spec[i]].to(dtype)  # [T, D]
        sin = sin_t[rope_plan.layer_spec[i]].to(dtype)
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        q = a.q_proj(h).view(T, H, D).transpose(0, 1)  # [H, T, D]
        k = a.k_proj(h).view(T, Hkv, D).transpose(0, 1)  # [Hkv, T, D]
        v = a.v_proj(h).view(T, Hkv, D).transpose(0, 1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if kv_out is not None:
            kv_out.append((k.clone(), v.clone()))
        k = k.repeat_interleave(group, dim=0)  # [H, T, D]
        v = v.repeat_interleave(group, dim=0)
        scores = (q.float() @ k.float().transpose(1, 2)) / math.sqrt(D)  # [H, T, T]
        scores = scores.masked_fill(~allowed(pos, pos, None), float("-inf"))  # Llama: full causal everywhere
        attn = torch.softmax(scores, dim=-1) @ v.float()  # [H, T, D]
        x = x + a.o_proj(attn.to(dtype).transpose(0, 1).reshape(T, H * D))
        h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        m = layer.mlp
        gate = m.gate_proj(h)
        x = x + m.down_proj((gate * torch.sigmoid(gate)) * m.up_proj(h))
    x = rms_norm(x, model.norm.weight, c.rms_norm_eps)
    return (x @ model.lm_head.weight.T).float()[None]
