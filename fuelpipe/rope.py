"""Rotary position embeddings: frequency specs, the per-layer RoPE plan, host tables.

RoPE frequencies are per-token data, never part of a plan's key: the step
program receives this token's cos/sin rows as rebound inputs, so a change of
base or scaling needs no rebuild.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fuelpipe.errors import ConfigError

SCALING_KINDS = ("none", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"  # none | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            raise ConfigError(f"rope scaling kind must be one of {SCALING_KINDS}, got {self.kind!r}")
        if self.factor <= 0:
            raise ConfigError(f"rope scaling factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class RopeSpec:
    """One distinct RoPE frequency set: base, rotated width and scaling."""

    theta: float
    rotary_dim: int
    scaling: RopeScaling = field(default_factory=RopeScaling)

    def __post_init__(self) -> None:
        if self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ConfigError(f"rotary_dim must be a positive even number, got {self.rotary_dim}")
        if self.theta <= 0:
            raise ConfigError(f"rope theta must be > 0, got {self.theta}")

    def inv_freq(self) -> torch.Tensor:
        """[rotary_dim / 2] f32 inverse frequencies, scaling applied."""
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        inv = 1.0 / (self.theta**exponent)
        s = self.scaling
        if s.kind == "linear":
            inv = inv / s.factor
        elif s.kind == "llama3":
            inv = _llama3_scale(inv, s)
        return inv


def _llama3_scale(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama-3.1 frequency scaling: long wavelengths divided by factor, short kept, smooth between."""
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True)
class RopePlan:
    """Per-layer RoPE variation as data: distinct specs plus each layer's index into them."""

    specs: tuple[RopeSpec, ...]
    layer_spec: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.specs:
            raise ConfigError("a RopePlan needs at least one RopeSpec")
        bad = [i for i in self.layer_spec if not 0 <= i < len(self.specs)]
        if bad:
            raise ConfigError(f"RopePlan layer_spec indices {bad} out of range [0, {len(self.specs)})")
        widths = {s.rotary_dim for s in self.specs}
        if len(widths) != 1:
            raise ConfigError(f"all RoPE specs of one model must rotate the same width, got {sorted(widths)}")

    @classmethod
    def uniform(cls, spec: RopeSpec, n_layers: int) -> "RopePlan":
        return cls(specs=(spec,), layer_spec=(0,) * n_layers)

    @property
    def rotary_dim(self) -> int:
        return self.specs[0].rotary_dim


def rope_tables(plan: RopePlan, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tables ``cos, sin``: [n_specs, max_positions, rotary_dim] f32 (halves duplicated)."""
    pos = torch.arange(max_positions, dtype=torch.float32)
    cos, sin = [], []
    for spec in plan.specs:
        freqs = torch.outer(pos, spec.inv_freq())  # [P, rot/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, rot]
        cos.append(emb.cos())
        sin.append(emb.sin())
    return torch.stack(cos), torch.stack(sin)


def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    """[..., 2*half] -> [..., 2*half] with halves (a, b) -> (-b, a)."""
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, head_dim: int) -> torch.Tensor:
    """Rotate the leading ``rotary_dim`` channels of ``x`` [B, H, T, head_dim]; pass the rest through bit-exact.

    cos, sin: [B, 1, T, rotary_dim] (or anything broadcasting against x's leading dims, such as [T, rotary_dim]).
    Dimensions are static ints so the traced program has no shape logic.
    """
    if rotary_dim == head_dim:
        return x * cos + rotate_half(x, rotary_dim // 2) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + rotate_half(x_rot, rotary_dim // 2) * sin, x_pass), dim=-1)


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate adjacent channel pairs (x0, x1), (x2, x3), ... of ``x`` [..., T, rotary_dim].

    The pair layout DeepSeek-V2 checkpoints use. cos, sin: [..., T, rotary_dim] (broadcasting
    against x) in the shared duplicated-halves layout; pair i uses column i.
    """
    half = rotary_dim // 2
    pairs = x.unflatten(-1, (half, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[..., :half], sin[..., :half]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
