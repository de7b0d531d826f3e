"""Building blocks shared by model families: norms, gated MLPs, cached attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fuelpipe.backbone import LayerInputs
from fuelpipe.rope import apply_rotary


class RMSNorm(nn.Module):
    """RMS norm computed in f32. ``unit_offset`` scales by (1 + w) (Gemma) instead of w."""

    def __init__(self, dim: int, eps: float, *, unit_offset: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        init = torch.zeros if unit_offset else torch.ones
        self.weight = nn.Parameter(init(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(dtype)
        return self.weight * xf.to(dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with act=silu, GeGLU with act=gelu(tanh)."""

    def __init__(self, hidden: int, inter: int, act: str = "silu", bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=bias, device=device, dtype=dtype)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate_proj(x)
        g = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down_proj(g * self.up_proj(x))


def split_heads(x: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """[B, T, H*D] -> [B, H, T, D]."""
    return x.unflatten(-1, (n_heads, head_dim)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B, T, H*D]."""
    return x.transpose(1, 2).flatten(2)


def cached_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: LayerInputs, scale: float, rotary_dim: int, head_dim: int
) -> torch.Tensor:
    """RoPE q/k, write k/v through the layer's KV view, attend. q [B,H,T,D], k/v [B,Hkv,T,D] -> [B,H,T,Dv]."""
    q = apply_rotary(q, inputs.cos, inputs.sin, rotary_dim, head_dim)
    k = apply_rotary(k, inputs.cos, inputs.sin, rotary_dim, head_dim)
    attend = getattr(inputs.kv, "attend", None)  # a view that writes and attends in one call (batch slots)
    if attend is not None:
        return attend(q, k, v, inputs.mask, scale)
    keys, values, mask = inputs.kv.write_and_read(k, v, inputs.mask)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
