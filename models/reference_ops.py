"""Plain full-sequence math shared by the families' no-cache references.

Every function here works on a whole sequence at once, with no cache, no plan
and no fused kernel, and takes its numbers (window, RoPE base, scale) as
arguments: a reference derives them from its config, never from the
``mask_plan`` / ``rope_plan`` the decode path runs on, so corrupting those
cannot also corrupt the oracle.
"""
from __future__ import annotations

from typing import Optional

import torch

from fuelpipe.rope import RopePlan, RopeScaling, RopeSpec, rope_tables


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, unit_offset: bool = False) -> torch.Tensor:
    """RMS norm in f32; scales by (1 + w) in f32 when ``unit_offset`` (Gemma), by w in x's dtype otherwise."""
    xf = x.float()
    normed = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


def rope_rows(theta: float, rotary_dim: int, scaling: RopeScaling, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim] f32 for positions 0..length-1."""
    inv_freq = RopeSpec(theta=theta, rotary_dim=rotary_dim, scaling=scaling).inv_freq()
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [T, rot/2]
    angles = torch.cat((angles, angles), dim=-1)  # [T, rot]
    factor = scaling.cos_sin_factor()
    return angles.cos() * factor, angles.sin() * factor


def rows_from_plan(plan: RopePlan, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of ``layer`` from an explicitly supplied RoPE plan (callers testing a RoPE change)."""
    cos, sin = rope_tables(plan, length)
    return cos[plan.layer_spec[layer]], sin[plan.layer_spec[layer]]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [H, T, D]: rotate the leading cos.shape[-1] channels as (a, b) -> (a cos - b sin, b cos + a sin)."""
    rot = cos.shape[-1]
    half = rot // 2
    a, b, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.cat((a * cos[:, :half] - b * sin[:, :half], b * cos[:, half:] + a * sin[:, half:]), dim=-1)
    return torch.cat((rotated, rest), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: Optional[int]) -> torch.Tensor:
    """q [H, T, D], k/v [Hkv, T, D] -> [T, H*D]. Causal; within the last ``window`` positions when given."""
    H, T, D = q.shape
    group = H // k.shape[0]
    k = k.repeat_interleave(group, dim=0).float()  # [H, T, D]
    v = v.repeat_interleave(group, dim=0).float()
    pos = torch.arange(T)
    distance = pos[:, None] - pos[None, :]  # query minus key
    visible = distance >= 0
    if window is not None:
        visible &= distance < window
    scores = (q.float() @ k.transpose(1, 2)) * scale  # [H, T, T]
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [H, T, D]
    return out.to(q.dtype).transpose(0, 1).reshape(T, H * D)


def heads(x: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """[T, n*D] -> [n, T, D]."""
    return x.view(x.shape[0], n_heads, head_dim).transpose(0, 1)
