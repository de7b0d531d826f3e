"""The Gemma 3 oracle: a readable full-sequence forward with no cache, no plan, no fused kernels.

Whether a layer is local or global is read from the config's layer kinds, and
its window and RoPE base follow from that, never from the model's
``mask_plan`` / ``rope_plan`` (RoPE rows come from an explicit plan only when
one is passed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fuelpipe.masks import SLIDING
from fuelpipe.rope import RopePlan, RopeScaling
from models.reference_ops import attend, heads, rms_norm, rope_rows, rotate, rows_from_plan


@torch.no_grad()
def gemma3_reference_logits(model, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor:
    """token_ids [1, T] -> logits [1, T, vocab] f32."""
    c = model.config
    T = token_ids.shape[1]
    H, Hkv, D, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    dtype = model.embed_tokens.weight.dtype
    local_rows = rope_rows(c.rope_local_base_freq, D, RopeScaling(), T)
    global_rows = rope_rows(c.rope_theta, D, c.rope_scaling, T)

    def norm(x, weight):
        return rms_norm(x, weight, eps, unit_offset=True)

    embed_scale = torch.tensor(c.hidden_size**0.5, dtype=dtype)
    x = model.embed_tokens.weight[token_ids[0]] * embed_scale  # [T, hidden]
    for i, layer in enumerate(model.layers):
        is_local = c.resolved_layer_types[i] == SLIDING
        cos, sin = local_rows if is_local else global_rows
        if rope_plan is not None:
            cos, sin = rows_from_plan(rope_plan, i, T)
        a = layer.self_attn
        h = norm(x, layer.input_layernorm.weight)
        q = norm(heads(h @ a.q_proj.weight.T, H, D), a.q_norm.weight)  # [H, T, D], normed per head
        k = norm(heads(h @ a.k_proj.weight.T, Hkv, D), a.k_norm.weight)  # [Hkv, T, D]
        v = heads(h @ a.v_proj.weight.T, Hkv, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attn = attend(q, k, v, c.query_pre_attn_scalar**-0.5, c.sliding_window if is_local else None)
        x = x + norm(attn @ a.o_proj.weight.T, layer.post_attention_layernorm.weight)
        h = norm(x, layer.pre_feedforward_layernorm.weight)
        m = layer.mlp
        ff = (F.gelu(h @ m.gate_proj.weight.T, approximate="tanh") * (h @ m.up_proj.weight.T)) @ m.down_proj.weight.T
        x = x + norm(ff, layer.post_feedforward_layernorm.weight)
    logits = (norm(x, model.norm.weight) @ model.embed_tokens.weight.T).float()
    if c.final_logit_softcapping is not None:
        logits = c.final_logit_softcapping * torch.tanh(logits / c.final_logit_softcapping)
    return logits[None]
