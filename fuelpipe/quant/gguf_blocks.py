"""A GGUF file's own quantized blocks, re-laid (never re-quantized) into the kernels' packed forms.

Which file blocks a kind can take as they are (every one at group size 32):

| file type | kind | how |
|---|---|---|
| Q8_0 | int8 | the int8 values and the f16 scale, copied |
| Q4_1 | int4 | the 16 nibble bytes (same order), f16 scale and min, copied |
| Q4_0 | int4 | the nibble bytes copied; scale d, min -8 d (f32: exact) |
| Q4_K | int4 | each 32-element sub-block: its nibbles; scale d * sc and min -dmin * m (f32: exact) |

Anything else (F32/F16/BF16, Q5_*, Q6_K, another group size) is dequantized and
quantized with ``fuelpipe.quant.formats.quantize``. A tensor the file keeps at
more than 4 bits (Q8_0, Q5_*, Q6_K) is held at int8 in an int4 model: the file's
author kept it wider on purpose.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as T

from fuelpipe.quant.formats import BLOCK, PackedWeight, QuantKind, QuantSpec, pack_int4

WIDER_THAN_4_BITS = {T.Q8_0, T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K}
AS_IS = {QuantKind.int8: {T.Q8_0}, QuantKind.int4: {T.Q4_0, T.Q4_1, T.Q4_K}}


def kind_for(spec: QuantSpec, vocabulary: bool, ggml_type: int) -> QuantKind:
    """The kind one file tensor is held in under ``spec``."""
    if spec.kind is QuantKind.int4 and (vocabulary or _type(ggml_type) in WIDER_THAN_4_BITS):
        return QuantKind.int8
    return spec.kind


def _type(ggml_type: int):
    try:
        return T(ggml_type)
    except ValueError:
        return None


def _f16(b: np.ndarray, start: int) -> np.ndarray:
    return b[:, start:start + 2].copy().view(np.float16)[:, 0]


def packed_from_blocks(raw: np.ndarray, ggml_type: int, shape: tuple[int, int], kind: QuantKind,
                       group_size: int) -> Optional[PackedWeight]:
    """The file's blocks of an [N, K] tensor as ``kind``, or None when they cannot be used as they are."""
    t = _type(ggml_type)
    if group_size != BLOCK or len(shape) != 2 or t not in AS_IS.get(kind, ()):
        return None
    n, k = shape
    b = np.asarray(raw, dtype=np.uint8)
    if t is T.Q8_0:
        b = b.reshape(-1, 34)
        q = torch.from_numpy(b[:, 2:].copy().view(np.int8).reshape(n, k))
        scales = torch.from_numpy(_f16(b, 0).reshape(n, k // 32).copy())
        return PackedWeight(QuantKind.int8, q.contiguous(), scales.contiguous())
    if t is T.Q4_1:
        b = b.reshape(-1, 20)
        q = torch.from_numpy(b[:, 4:].reshape(n, k // 2).copy())
        return PackedWeight(QuantKind.int4, q, torch.from_numpy(_f16(b, 0).reshape(n, k // 32).copy()),
                            torch.from_numpy(_f16(b, 2).reshape(n, k // 32).copy()))
    if t is T.Q4_0:
        b = b.reshape(-1, 18)
        d = _f16(b, 0).astype(np.float32)
        q = torch.from_numpy(b[:, 2:].reshape(n, k // 2).copy())
        return PackedWeight(QuantKind.int4, q, torch.from_numpy(d.reshape(n, k // 32).copy()),
                            torch.from_numpy((-8.0 * d).reshape(n, k // 32).copy()))
    # Q4_K: 256-element super-blocks of 8 sub-blocks; sub-block 2i / 2i+1 are the low / high nibbles of chunk i.
    from fuelpipe.weights.dequant import _k_scales_mins  # the one reading of the packed 6-bit scales

    b = b.reshape(-1, 144)
    sc, mn = _k_scales_mins(b[:, 4:16])  # [S, 8] each
    d, dmin = _f16(b, 0).astype(np.float32), _f16(b, 2).astype(np.float32)
    qs = b[:, 16:].reshape(-1, 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, k)  # element order, 0..15
    scales = (d[:, None] * sc).reshape(n, k // 32)
    mins = (-(dmin[:, None] * mn)).reshape(n, k // 32)
    return PackedWeight(QuantKind.int4, pack_int4(torch.from_numpy(codes)), torch.from_numpy(scales.copy()),
                        torch.from_numpy(mins.copy()))


def row_permutation(transform, n: int, config) -> Optional[torch.Tensor]:
    """The row order a checkpoint transform applies, when it only permutes rows (llama's Q/K un-permute)."""
    probe = transform(torch.arange(n, dtype=torch.float64)[:, None], config)
    if probe.shape != (n, 1):
        return None
    perm = probe[:, 0].round().long()
    if not torch.equal(perm.sort().values, torch.arange(n)):
        return None
    return perm


def permute_rows(p: PackedWeight, perm: torch.Tensor) -> PackedWeight:
    pick = (lambda t: None if t is None else t[perm].contiguous())
    return PackedWeight(p.kind, pick(p.q), pick(p.scales), pick(p.mins))
