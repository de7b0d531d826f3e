"""DeepSeek-V2 decoder: multi-head latent attention decoded in the absorbed form, dense or MoE MLPs.

The cache holds, per token and layer, only the normalised KV latent (slot 0,
[kv_lora_rank]) and the single-head RoPE key (slot 1, [qk_rope_head_dim]).
Decode never expands K/V: queries are projected into the latent space with
the key half of ``kv_b_proj`` and the attended latent is projected out with
its value half. Those absorbed matrices are views of ``kv_b_proj.weight``
taken inside the step, so an in-place weight update can never leave them
stale (and the plan key's weights version rebuilds any plan holding copies).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fuelpipe.backbone import LayerInputs
from fuelpipe.decoder_skeleton import NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.layers import GatedMLP, RMSNorm
from fuelpipe.rope import RopePlan, RopeSpec, apply_rotary_interleaved
from models.deepseek_v2.config import ROPE_FIELDS, DeepseekV2Config

LATENT_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm use the checkpoint's fixed epsilon


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, c: DeepseekV2Config, device=None, dtype=None) -> None:
        super().__init__()
        self.n_heads, self.nope, self.rope, self.v_dim = (
            c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim)
        self.rank = c.kv_lora_rank
        self.scale = c.softmax_scale  # fixed at build, like the weights (YaRN's mscale enters here)
        kw = dict(device=device, dtype=dtype)
        H = self.n_heads
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.hidden_size, H * c.qk_head_dim, bias=False, **kw)
        else:
            self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=c.attention_bias, **kw)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, LATENT_NORM_EPS, **kw)
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim, bias=False, **kw)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim,
                                            bias=c.attention_bias, **kw)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, LATENT_NORM_EPS, **kw)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim), bias=False, **kw)
        self.o_proj = nn.Linear(H * c.v_head_dim, c.hidden_size, bias=c.attention_bias, **kw)
        self.has_q_lora = c.q_lora_rank is not None

    def query(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_q_lora:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return self.q_proj(x)

    def absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of kv_b_proj.weight: W_uk [H, nope, r] and W_uv [H, v, r]."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.nope + self.v_dim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def forward(self, x: torch.Tensor, inputs: LayerInputs, rotary_dim: int) -> torch.Tensor:
        # rotary_dim (the RoPE plan's width) is qk_rope_head_dim by construction; the checkpoint's
        # split of q and of the compressed key (self.rope) is what this code reads.
        H = self.n_heads
        q = self.query(x).unflatten(-1, (H, self.nope + self.rope)).transpose(1, 2)  # [B, H, T, qk]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x)  # [B, T, r + rope]
        latent, k_pe = compressed.split([self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent)  # [B, T, r]
        q_pe = apply_rotary_interleaved(q_pe, inputs.cos, inputs.sin, self.rope)  # [B, H, T, rope]
        k_pe = apply_rotary_interleaved(k_pe, inputs.cos[:, 0], inputs.sin[:, 0], self.rope)  # [B, T, rope]
        latents, rope_keys, mask = inputs.kv.write_and_read_latent(latent, k_pe, inputs.mask)  # [B, S, r], [B, S, rope]
        w_uk, w_uv = self.absorbed()
        q_latent = torch.matmul(q_nope, w_uk)  # [B, H, T, r]
        scores = (torch.matmul(q_latent, latents.transpose(1, 2)[:, None])
                  + torch.matmul(q_pe, rope_keys.transpose(1, 2)[:, None]))  # [B, H, T, S]
        scores = scores * self.scale + mask  # mask [B, 1, T, S]
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        out_latent = torch.matmul(probs, latents[:, None])  # [B, H, T, r]
        out = torch.matmul(out_latent, w_uv.transpose(1, 2))  # [B, H, T, v]
        return self.o_proj(out.transpose(1, 2).flatten(2))  # [B, T, H*v]


class DeepseekV2Router(nn.Module):
    def __init__(self, c: DeepseekV2Config, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size, device=device, dtype=dtype),
                                   requires_grad=False)


class DeepseekV2Experts(nn.Module):
    """Routed experts stored as stacked tensors (the checkpoint layout)."""

    def __init__(self, c: DeepseekV2Config, device=None, dtype=None) -> None:
        super().__init__()
        E, I, Hd = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, Hd, device=device, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(E, Hd, I, device=device, dtype=dtype), requires_grad=False)


class DeepseekV2Moe(nn.Module):
    """Top-k greedy routing over softmax scores, weights scaled, plus always-on shared experts."""

    def __init__(self, c: DeepseekV2Config, device=None, dtype=None) -> None:
        super().__init__()
        self.top_k, self.scaling = c.num_experts_per_tok, c.routed_scaling_factor
        self.gate = DeepseekV2Router(c, device, dtype)
        self.experts = DeepseekV2Experts(c, device, dtype)
        self.shared_experts = (
            GatedMLP(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts, "silu", False, device, dtype)
            if c.n_shared_experts else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(0, 1)  # [N = B*T, hidden]: routing is per token
        scores = torch.softmax(F.linear(h.float(), self.gate.weight.float()), dim=-1)  # [N, E]
        weights, idx = torch.topk(scores, self.top_k, dim=-1)  # [N, k]
        weights = weights * self.scaling
        gate_up = torch.matmul(self.experts.gate_up_proj[idx], h[:, None, :, None]).squeeze(-1)  # [N, k, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.silu(gate) * up  # [N, k, I]
        out = torch.matmul(self.experts.down_proj[idx], act[..., None]).squeeze(-1)  # [N, k, hidden]
        routed = (out * weights[..., None].to(out.dtype)).sum(dim=1)  # [N, hidden]
        if self.shared_experts is not None:
            routed = routed + self.shared_experts(h)
        return routed.view_as(x)  # [B, T, hidden]


class DeepseekV2Model(StackedDecoder):
    family = "deepseek_v2"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def __init__(self, config: DeepseekV2Config, *, device=None, dtype=torch.float32) -> None:
        super().__init__(config, device=device, dtype=dtype)
        self.latent_slots = ((config.kv_lora_rank,), (config.qk_rope_head_dim,))  # [r], [rope] per token

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> PreNormLayer:
        c: DeepseekV2Config = self.config
        mlp = (DeepseekV2Moe(c, device, dtype) if c.is_moe_layer(index)
               else GatedMLP(c.hidden_size, c.intermediate_size, "silu", False, device, dtype))
        return PreNormLayer(c.hidden_size, norm, MultiHeadLatentAttention(c, device, dtype), mlp)

    def kv_geometry(self) -> tuple[int, int]:
        return 1, self.config.qk_head_dim  # one latent "head" per token; the slots above say what it holds

    def build_rope_plan(self) -> RopePlan:
        return _rope_plan_of(self.config)

    def expanded_kv_bytes_per_token(self, element_size: int) -> int:
        """What an equivalent expanded K/V cache would store per token (all heads, all layers)."""
        c = self.config
        return c.num_hidden_layers * c.num_attention_heads * (c.qk_head_dim + c.v_head_dim) * element_size

    def reference_logits(self, token_ids, rope_plan: RopePlan | None = None, kv_out=None) -> torch.Tensor:
        from models.deepseek_v2.reference import deepseek_v2_reference_logits

        # The oracle derives RoPE from the config, never from self.rope_plan (the decode path's data).
        return deepseek_v2_reference_logits(self, token_ids, rope_plan or _rope_plan_of(self.config), kv_out)


def _rope_plan_of(c: DeepseekV2Config) -> RopePlan:
    spec = RopeSpec(theta=c.rope_theta, rotary_dim=c.qk_rope_head_dim, scaling=c.rope_scaling)
    return RopePlan.uniform(spec, c.num_hidden_layers)
