"""The DeepSeek-V2 oracle: full sequence, no cache, K and V expanded per head (the naive form)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fuelpipe.masks import allowed
from fuelpipe.rope import RopePlan


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_pairs(x: torch.Tensor, angle: torch.Tensor, magnitude: float) -> torch.Tensor:
    """Rotate adjacent pairs of x [..., T, R] by angle [T, R/2], scaled by ``magnitude`` (complex multiplication)."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * torch.polar(torch.full_like(angle, magnitude), angle)).flatten(-2).to(x.dtype)


def moe(layer_mlp, c, h: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert."""
    out = torch.zeros_like(h)
    scores = torch.softmax(h.float() @ layer_mlp.gate.weight.float().T, dim=-1)
    for t in range(h.shape[0]):
        top = torch.topk(scores[t], c.num_experts_per_tok)
        for w, e in zip(top.values, top.indices):
            gate_up = layer_mlp.experts.gate_up_proj[e] @ h[t]
            gate, up = gate_up.chunk(2)
            out[t] += (w * c.routed_scaling_factor).to(h.dtype) * (layer_mlp.experts.down_proj[e] @ (F.silu(gate) * up))
    if layer_mlp.shared_experts is not None:
        out = out + layer_mlp.shared_experts(h)
    return out


@torch.no_grad()
def deepseek_v2_reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan, kv_out=None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32. ``kv_out`` collects (latent [T, r], rope key [T, rope])."""
    c = model.config
    T, H = token_ids.shape[1], c.num_attention_heads
    nope, rope, vd, r = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    spec = rope_plan.specs[0]
    angle = torch.outer(torch.arange(T, dtype=torch.float32), spec.inv_freq())  # [T, rope/2]
    magnitude = spec.scaling.cos_sin_factor()  # YaRN's attention factor on the rotated part
    pos = torch.arange(T)
    x = model.embed_tokens.weight[token_ids[0]]  # [T, hidden]
    for i, layer in enumerate(model.layers):
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        q = a.query(h).view(T, H, nope + rope).transpose(0, 1)  # [H, T, qk]
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        compressed = a.kv_a_proj_with_mqa(h)
        latent = rms_norm(compressed[:, :r], a.kv_a_layernorm.weight, 1e-6)  # [T, r]
        k_pe = rotate_pairs(compressed[:, r:], angle, magnitude)  # [T, rope]
        q_pe = rotate_pairs(q_pe, angle, magnitude)
        if kv_out is not None:
            kv_out.append((latent.clone(), k_pe.clone()))
        kv = a.kv_b_proj(latent).view(T, H, nope + vd).transpose(0, 1)  # expanded: [H, T, nope + v]
        k = torch.cat((kv[..., :nope], k_pe.expand(H, T, rope)), dim=-1)  # [H, T, qk]
        v = kv[..., nope:]  # [H, T, v]
        scores = torch.cat((q_nope, q_pe), dim=-1) @ k.transpose(1, 2) * c.softmax_scale
        scores = scores.masked_fill(~allowed(pos, pos, None), float("-inf"))
        attn = torch.softmax(scores.float(), dim=-1).to(x.dtype) @ v  # [H, T, v]
        x = x + a.o_proj(attn.transpose(0, 1).reshape(T, H * vd))
        h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        x = x + (moe(layer.mlp, c, h) if c.is_moe_layer(i) else layer.mlp(h))
    x = rms_norm(x, model.norm.weight, c.rms_norm_eps)
    return (x @ model.lm_head.weight.T).float()[None]
