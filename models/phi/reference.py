"""The Phi oracle: a readable full-sequence forward with no cache, no plan, no fused kernels.

Window and rotated width come from the config, not from the model's
``mask_plan`` / ``rope_plan``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fuelpipe.rope import RopePlan, RopeScaling
from models.reference_ops import attend, heads, rms_norm, rope_rows, rotate, rows_from_plan


@torch.no_grad()
def phi_reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32."""
    c = model.config
    T = token_ids.shape[1]
    H, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q_size, kv_size = H * D, Hkv * D
    cos, sin = rope_rows(c.rope_theta, int(D * c.partial_rotary_factor), RopeScaling(), T)
    x = model.embed_tokens.weight[token_ids[0]]  # [T, hidden]
    for i, layer in enumerate(model.layers):
        if rope_plan is not None:
            cos, sin = rows_from_plan(rope_plan, i, T)
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        qkv = h @ a.qkv_proj.weight.T  # [T, q_size + 2 * kv_size]
        q = heads(qkv[:, :q_size], H, D)  # [H, T, D]
        k = heads(qkv[:, q_size : q_size + kv_size], Hkv, D)  # [Hkv, T, D]
        v = heads(qkv[:, q_size + kv_size :], Hkv, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        x = x + attend(q, k, v, D**-0.5, c.sliding_window) @ a.o_proj.weight.T
        h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        gate, up = (h @ layer.mlp.gate_up_proj.weight.T).split(c.intermediate_size, dim=-1)
        x = x + (F.silu(gate) * up) @ layer.mlp.down_proj.weight.T
    x = rms_norm(x, model.norm.weight, c.rms_norm_eps)
    return (x @ model.lm_head.weight.T).float()[None]
