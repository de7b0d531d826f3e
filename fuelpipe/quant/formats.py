"""Low-bit weight formats: the packed tensors, quantizing into them, and their readable meaning.

A ``QuantSpec`` names a kind (``int8``, ``int4``, ``bf16``) and a group size;
``PackedWeight`` holds one weight matrix in that form (layouts in
``fuelpipe/kernels/quant_gemv.cpp``). ``dequantize`` is the reference: what
the compiled kernels compute is ``F.linear(x, dequantize(p))`` up to the
order of f32 additions, and the tests hold them to that.

Quantizing from f32 (random weights, f32/bf16 checkpoints, and GGUF tensors
whose blocks the kernels cannot use as they are):

* int8: symmetric per group, ``scale = max|w| / 127``, ``q = round(w / scale)``
  (GGUF Q8_0's rule at group size 32);
* int4: asymmetric per group, ``scale = (max - min) / 15``, ``min = min``,
  ``code = round((w - min) / scale)`` in 0..15 (GGUF Q4_1's rule at 32).

Scales are stored as f16 (the GGUF convention) unless the source's scales
need f32 to stay exact (K-quant sub-block scales).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fuelpipe.errors import ConfigError, enum_member
from fuelpipe.modes import ActivationForm, QuantKind  # noqa: F401  (re-exported: the quant API names them)


BLOCK = 32  # the kernels' block: a group is a whole number of blocks


@dataclass(frozen=True)
class QuantSpec:
    """How a model's matrix weights are held: ``kind`` at ``group_size`` elements per scale."""

    kind: QuantKind = QuantKind.f32
    group_size: int = 32
    activations: ActivationForm = ActivationForm.auto  # resolved: never ``auto`` after construction

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", enum_member(QuantKind, self.kind, "weights.dtype"))
        object.__setattr__(self, "activations", enum_member(ActivationForm, self.activations, "weights.activations"))
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool):
            raise ConfigError(f"weights.group_size must be an integer multiple of {BLOCK}, got {self.group_size!r}")
        if self.group_size < BLOCK or self.group_size % BLOCK:
            raise ConfigError(f"weights.group_size must be a positive multiple of {BLOCK}, got {self.group_size}")
        integer = self.kind in (QuantKind.int8, QuantKind.int4)
        if self.activations is ActivationForm.auto:
            object.__setattr__(self, "activations", ActivationForm.int16 if integer else ActivationForm.f32)
        elif activation_bits(self.activations) and not integer:
            raise ConfigError(f"weights.activations={self.activations.value} needs int8 or int4 weights (integer dot "
                              f"products), got weights.dtype={self.kind.value}")

    @property
    def quantized(self) -> bool:
        return self.kind is not QuantKind.f32

    def label(self) -> str:
        """``int8/g32`` (f32 activations), ``int8/g32/a16`` / ``int8/g32/a8`` (16- / 8-bit activations), ``bf16``, ``f32``."""
        if self.kind in (QuantKind.f32, QuantKind.bf16):
            return self.kind.value
        bits = activation_bits(self.activations)
        tail = f"/a{bits}" if bits else ""
        return f"{self.kind.value}/g{self.group_size}{tail}"


@dataclass
class PackedWeight:
    """One [N, K] weight in a low-bit form. ``q``: int8 [N, K] | uint8 [N, K/2] (int4) | bf16 [N, K]."""

    kind: QuantKind
    q: torch.Tensor
    scales: Optional[torch.Tensor] = None  # [N, K / G] f16 or f32 (int8, int4)
    mins: Optional[torch.Tensor] = None  # [N, K / G] (int4)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.q.shape
        return (n, k * 2) if self.kind is QuantKind.int4 else (n, k)

    @property
    def group_size(self) -> int:
        return self.shape[1] // self.scales.shape[1] if self.scales is not None else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scales, self.mins) if t is not None)


def fits(spec: QuantSpec, k: int) -> bool:
    """Whether a matrix with ``k`` input features can be held in ``spec``'s grouped form."""
    return spec.kind in (QuantKind.f32, QuantKind.bf16) or k % spec.group_size == 0


# ---- the reference -----------------------------------------------------------------------------

def unpack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] in block order (byte j of a 32-block: element j low, j + 16 high) -> codes [N, K] uint8."""
    n, half = q.shape
    blocks = q.view(n, half // 16, 16)
    return torch.cat((blocks & 0x0F, blocks >> 4), dim=-1).reshape(n, half * 2)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> uint8 [N, K/2] in block order (inverse of ``unpack_int4``)."""
    n, k = codes.shape
    blocks = codes.to(torch.uint8).view(n, k // BLOCK, BLOCK)
    return (blocks[..., :16] | (blocks[..., 16:] << 4)).reshape(n, k // 2).contiguous()


def dequantize(p: PackedWeight) -> torch.Tensor:
    """The f32 [N, K] matrix ``p`` stands for."""
    return dequantize_rows(p.kind, p.q, p.scales, p.mins, p.shape[1], p.group_size)


def dequantize_rows(kind: QuantKind, q: torch.Tensor, scales: Optional[torch.Tensor], mins: Optional[torch.Tensor],
                    k: int, group_size: int) -> torch.Tensor:
    """Rows of a packed matrix ([.., K] or [.., K/2] codes, [.., K/G] scales) -> f32 [.., K]. ``k`` and
    ``group_size`` are plain ints, so an fx trace (a looked-up embedding row) records the same arithmetic."""
    if kind is QuantKind.bf16:
        return q.float()
    s = scales.float().repeat_interleave(group_size, dim=-1)  # [.., K]
    if kind is QuantKind.int8:
        return q.float() * s
    blocks = q.unflatten(-1, (k // BLOCK, 16))  # [.., K/32, 16]
    codes = torch.cat((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)  # [.., K] in 0..15
    return codes.float() * s + mins.float().repeat_interleave(group_size, dim=-1)


# ---- activations at 16 or 8 bits (ActivationForm.int16 / int8): what the *_a16 / *_a8 kernels compute ----

ACT_LEVELS = 32767  # int16 codes in -32767..32767: symmetric, so -x quantizes to -(code of x)
ACT8_LEVELS = 127  # int8 codes in -127..127, symmetric likewise


def activation_bits(form: ActivationForm) -> Optional[int]:
    """16 or 8 for the integer activation forms, None for f32 (and ``auto``, before it is resolved)."""
    return {ActivationForm.int16: 16, ActivationForm.int8: 8}.get(form)


def activation_levels(bits: int) -> int:
    """The largest activation code at ``bits`` (16 or 8): codes run symmetrically in -L..L."""
    if bits not in (16, 8):
        raise ConfigError(f"activations are quantized to 16 or 8 bits, got bits={bits!r}")
    return ACT_LEVELS if bits == 16 else ACT8_LEVELS


def quantize_activations(x: torch.Tensor, bits: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """f32 [.., K] (K a multiple of 32) -> (codes int16 / int8 [.., K], steps f32 [.., K/32]).

    Per 32-element block: ``step = max|x| / L``, ``code = round_half_even(x / step)`` (0 for an
    all-zero block), L = 32767 at 16 bits and 127 at 8. A block with a non-finite element gets a NaN
    step, so its NaN reaches the output as it would with f32 activations. The kernels compute the same
    codes and steps, element for element.
    """
    levels = activation_levels(bits)
    blocks = x.float().unflatten(-1, (x.shape[-1] // BLOCK, BLOCK))  # [.., K/32, 32]
    step = blocks.abs().amax(-1) / levels  # [.., K/32]
    step = torch.where(torch.isfinite(blocks).all(-1), step, torch.full_like(step, float("nan")))
    safe = torch.where(step > 0, step, torch.ones_like(step))[..., None]
    codes = torch.where(step[..., None] > 0, torch.round(blocks / safe), torch.zeros_like(blocks))
    return codes.clamp(-levels, levels).to(torch.int16 if bits == 16 else torch.int8).flatten(-2), step


def round_trip_activations(x: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """The f32 activations an integer-activation kernel multiplies: code * step, per element."""
    codes, step = quantize_activations(x, bits)
    return (codes.float().unflatten(-1, step.shape[-1:] + (BLOCK,)) * step[..., None]).flatten(-2)


# ---- quantizing from f32 -----------------------------------------------------------------------

def quantize(w: torch.Tensor, kind: QuantKind, group_size: int) -> PackedWeight:
    """Quantize an f32/bf16 [N, K] matrix (K a multiple of ``group_size`` for the grouped kinds)."""
    w = w.detach().float()
    if kind is QuantKind.bf16:
        return PackedWeight(kind, w.to(torch.bfloat16).contiguous())
    n, k = w.shape
    if k % group_size:
        raise ConfigError(f"cannot hold a [{n}, {k}] weight at group size {group_size}: in_features must be a multiple of it")
    groups = w.view(n, k // group_size, group_size)
    if kind is QuantKind.int8:
        amax = groups.abs().amax(-1)  # [N, K/G]
        scale = (amax / 127.0).to(torch.float16)
        inv = torch.where(scale.float() > 0, 1.0 / scale.float(), torch.zeros_like(amax))
        q = torch.round(groups * inv[..., None]).clamp_(-127, 127).to(torch.int8)
        return PackedWeight(kind, q.view(n, k).contiguous(), scale.contiguous())
    if kind is QuantKind.int4:
        lo, hi = groups.amin(-1), groups.amax(-1)
        scale = ((hi - lo) / 15.0).to(torch.float16)
        mins = lo.to(torch.float16)
        inv = torch.where(scale.float() > 0, 1.0 / scale.float(), torch.zeros_like(lo))
        codes = torch.round((groups - mins.float()[..., None]) * inv[..., None]).clamp_(0, 15)
        return PackedWeight(kind, pack_int4(codes.view(n, k)), scale.contiguous(), mins.contiguous())
    raise ConfigError(f"quantize: kind {kind.value!r} is not a quantized kind")
