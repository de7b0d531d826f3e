"""Rotary position embeddings: frequency specs, the per-layer RoPE plan, host tables.

RoPE frequencies are per-token data, never part of a plan's key: the step
program receives this token's cos/sin rows as rebound inputs, so a change of
base or scaling needs no rebuild.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from fuelpipe.errors import ConfigError

SCALING_KINDS = ("none", "linear", "llama3", "yarn")
# YaRN's fields and their values when a config leaves them out (transformers' defaults; 0 is 'not given')
YARN_DEFAULTS = dict(beta_fast=32.0, beta_slow=1.0, mscale=0.0, mscale_all_dim=0.0, attention_factor=None,
                     truncate=True)


@dataclass(frozen=True)
class RopeScaling:
    """How a RoPE spec's frequencies are scaled. Fields after ``original_max_position_embeddings`` are YaRN's.

    YaRN (kind "yarn") blends interpolated (``/ factor``) and original frequencies over a ramp set by
    ``beta_fast``/``beta_slow`` rotations at ``original_max_position_embeddings``, and multiplies cos/sin by
    an attention factor: ``attention_factor`` when given, else ``mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)`` when both are non-zero, else ``mscale(factor, 1)`` (``yarn_mscale``).
    A family may also scale its softmax by ``mscale_all_dim`` (DeepSeek-V2 does); that is the family's.
    """

    kind: str = "none"  # none | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # 0: not given
    mscale_all_dim: float = 0.0  # 0: not given
    attention_factor: Optional[float] = None  # an explicit cos/sin factor (YaRN); None: derived from the above
    truncate: bool = True  # YaRN rounds its ramp bounds outwards to whole dimensions

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            raise ConfigError(f"rope scaling kind must be one of {SCALING_KINDS}, got {self.kind!r}")
        if not self.factor > 0:
            raise ConfigError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.kind == "yarn":
            self._check_yarn()
        else:
            stray = [f"{k}={getattr(self, k)!r}" for k, v in YARN_DEFAULTS.items() if getattr(self, k) != v]
            if stray:
                raise ConfigError(f"rope scaling kind {self.kind!r} takes no YaRN fields, got {', '.join(stray)}")

    def _check_yarn(self) -> None:
        for name in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"yarn rope scaling {name} must be finite, got {getattr(self, name)}")
        if self.factor < 1:
            raise ConfigError(f"yarn rope scaling factor must be >= 1 (it extends the context), got {self.factor}")
        if self.original_max_position_embeddings < 1:
            raise ConfigError(f"yarn rope scaling original_max_position_embeddings must be >= 1, "
                              f"got {self.original_max_position_embeddings}")
        if not 0 < self.beta_slow <= self.beta_fast:
            raise ConfigError(f"yarn rope scaling needs 0 < beta_slow <= beta_fast, "
                              f"got beta_slow={self.beta_slow}, beta_fast={self.beta_fast}")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) < 0:
                raise ConfigError(f"yarn rope scaling {name} must be >= 0 (0: not given), got {getattr(self, name)}")
        af = self.attention_factor
        if af is not None and not (math.isfinite(af) and af > 0):
            raise ConfigError(f"yarn rope scaling attention_factor must be a finite number > 0 or None, "
                              f"got {self.attention_factor}")
        if not isinstance(self.truncate, bool):
            raise ConfigError(f"yarn rope scaling truncate must be true or false, got {self.truncate!r}")

    def cos_sin_factor(self) -> float:
        """What cos/sin rows are multiplied by (YaRN's attention factor; 1 for every other kind)."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched by ``factor``: 1 + 0.1 * mscale * ln(factor)."""
    return 1.0 if factor <= 1 else 1.0 + 0.1 * mscale * math.log(factor)


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
        elif s.kind == "yarn":
            inv = _yarn_scale(self.theta, self.rotary_dim, s)
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


def _yarn_scale(theta: float, dim: int, s: RopeScaling) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than ``beta_slow`` times over the original context are interpolated
    (divided by factor), those turning more than ``beta_fast`` times are kept, a linear ramp between."""

    def dim_of(rotations: float) -> float:  # the (fractional) dimension index turning ``rotations`` times
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [rot/2]
    wavelen_base = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # [rot/2]
    return ramp / (s.factor * wavelen_base) + (1 - ramp) / wavelen_base  # ramp 1: interpolated, 0: kept


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
    """Host tables ``cos, sin``: [n_specs, max_positions, rotary_dim] f32 (halves duplicated).

    Each spec's rows carry its scaling's cos/sin factor (YaRN's attention factor; 1 otherwise).
    """
    pos = torch.arange(max_positions, dtype=torch.float32)
    cos, sin = [], []
    for spec in plan.specs:
        freqs = torch.outer(pos, spec.inv_freq())  # [P, rot/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, rot]
        factor = spec.scaling.cos_sin_factor()
        cos.append(emb.cos() * factor)
        sin.append(emb.sin() * factor)
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
