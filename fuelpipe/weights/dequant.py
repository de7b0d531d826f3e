"""Vectorised numpy dequantization of GGML tensor bytes to float32.

Every kernel reshapes the bytes to ``[n_blocks, type_size]``, slices the block
fields as columns and does whole-array integer/bit arithmetic: no per-element
or per-block Python loop. Block layouts follow ggml (``ggml-common.h``):

=======  =====  ========================================================================
type     bytes  block of 32 (or 256 for *_K)
=======  =====  ========================================================================
Q4_0     18     d f16 | qs[16]: element j low nibble, j+16 high nibble; x = d*(q-8)
Q4_1     20     d f16 | m f16 | qs[16]; x = d*q + m
Q5_0     22     d f16 | qh u32 (bit j = 5th bit of element j) | qs[16]; x = d*(q-16)
Q5_1     24     d f16 | m f16 | qh u32 | qs[16]; x = d*q + m
Q8_0     34     d f16 | qs i8[32]; x = d*q
Q4_K     144    d f16 | dmin f16 | 12 bytes of 6-bit (scale, min) x 8 | qs[128]
Q5_K     176    as Q4_K, plus qh[32] (bit k of byte l = 5th bit of sub-block k, lane l)
Q6_K     210    ql[128] | qh[64] | scales i8[16] (one per 16 elements) | d f16; x = d*s*(q-32)
=======  =====  ========================================================================

The loader uses these kernels; ``tests/weights/test_weights_dequant.py`` checks each
against ``gguf.quants.dequantize`` on random blocks.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """Column of one little-endian f16 field per block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] values: the low nibbles (elements 0..15), then the high ones (16..31)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits_32(qh_bytes: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian u32 -> [n, 32] bits, bit j for element j."""
    return np.unpackbits(qh_bytes, axis=1, bitorder="little")


def _f32(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f4").astype(np.float32, copy=True)


def _f16_plain(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f2").astype(np.float32)


def _bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


# The block kernels scale in place: on a 262k x 640 embedding one f32 temporary is 670 MB.
def _q8_0(b: np.ndarray) -> np.ndarray:
    x = b[:, 2:].view(np.int8).astype(np.float32)
    x *= _f16(b, 0)
    return x


def _q4_0(b: np.ndarray) -> np.ndarray:
    x = _nibbles(b[:, 2:]).astype(np.float32)
    x -= 8.0
    x *= _f16(b, 0)
    return x


def _q4_1(b: np.ndarray) -> np.ndarray:
    x = _nibbles(b[:, 4:]).astype(np.float32)
    x *= _f16(b, 0)
    x += _f16(b, 2)
    return x


def _q5_0(b: np.ndarray) -> np.ndarray:
    x = (_nibbles(b[:, 6:]) | (_high_bits_32(b[:, 2:6]) << 4)).astype(np.float32)
    x -= 16.0
    x *= _f16(b, 0)
    return x


def _q5_1(b: np.ndarray) -> np.ndarray:
    x = (_nibbles(b[:, 8:]) | (_high_bits_32(b[:, 4:8]) << 4)).astype(np.float32)
    x *= _f16(b, 0)
    x += _f16(b, 2)
    return x


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes -> 8 six-bit scales and 8 six-bit mins, each [n, 8] float32.

    Sub-blocks 0..3 keep their scale/min in the low 6 bits of bytes 0..3 / 4..7; sub-blocks
    4..7 keep the low 4 bits in bytes 8..11 and the top 2 bits in the spare bits of bytes 0..7.
    """
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: chunk i's low nibbles are sub-block 2i, its high nibbles 2i+1."""
    qs = qs.reshape(-1, 4, 32)
    return np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """x = d * scale * q - dmin * min, per 32-element sub-block."""
    scales, mins = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b, 0), _f16(b, 2)
    return (d * scales)[:, :, None] * q.astype(np.float32) - (dmin * mins)[:, :, None]


def _q4_k(b: np.ndarray) -> np.ndarray:
    return _k_affine(b, _k_nibbles(b[:, 16:144]))


def _q5_k(b: np.ndarray) -> np.ndarray:
    shifts = np.arange(8, dtype=np.uint8)[None, :, None]
    high = (b[:, None, 16:48] >> shifts) & 1  # [n, 8, 32]: bit k of lane l belongs to sub-block k
    return _k_affine(b, _k_nibbles(b[:, 48:176]) | (high << 4))


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql = b[:, 0:128].reshape(-1, 2, 2, 32)  # [n, half, (lanes 0..31 | 32..63), 32]
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)  # [n, half, 1, 32]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [n, half, 4, 32]: quarter j of the half
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    q = ((low | (high << 4)).astype(np.float32) - 32.0).reshape(-1, 16, 16)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)  # one per 16 consecutive elements
    return (_f16(b, 208) * scales)[:, :, None] * q


_BLOCK_KERNELS: dict[Q, Callable[[np.ndarray], np.ndarray]] = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
_PLAIN_KERNELS: dict[Q, Callable[[np.ndarray], np.ndarray]] = {Q.F32: _f32, Q.F16: _f16_plain, Q.BF16: _bf16}

SUPPORTED_TYPES: tuple[Q, ...] = tuple(_PLAIN_KERNELS) + tuple(_BLOCK_KERNELS)


def is_supported(ggml_type: int) -> bool:
    return ggml_type in {int(t) for t in SUPPORTED_TYPES}


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """GGML bytes (uint8, exactly the tensor's size) -> float32 array of ``shape`` (torch order).

    Raises ``KeyError`` for a type outside ``SUPPORTED_TYPES`` and ``ValueError`` for a byte count
    that does not match ``shape``; the loader turns both into typed errors naming the file.
    """
    qtype = Q(ggml_type)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    block, type_size = GGML_QUANT_SIZES[qtype]
    if raw.dtype != np.uint8 or raw.size != n // block * type_size or n % block:
        raise ValueError(f"{qtype.name} tensor of shape {list(shape)} needs {n // block * type_size} bytes, got {raw.size}")
    if qtype in _PLAIN_KERNELS:
        return _PLAIN_KERNELS[qtype](raw).reshape(shape)
    kernel = _BLOCK_KERNELS[qtype]
    return kernel(raw.reshape(-1, type_size)).reshape(shape)
