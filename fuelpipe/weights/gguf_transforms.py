"""Undo what llama.cpp's converter does to some tensors when it writes a GGUF file.

A family's GGUF tensor table (``TensorRule.transform``) names these: each takes
the stored tensor (f32) and the family config and returns the tensor as the
HF-named parameter holds it. ``fuelpipe.quant.gguf_blocks.row_permutation``
recognises a transform that only reorders rows, so packed file blocks can be
kept under it.
"""
from __future__ import annotations

import torch


def _unpermute(n_heads: int, w: torch.Tensor) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation for its interleaved RoPE.

    convert_hf_to_gguf stores, within each head, rows ``[r0, r_half, r1, r_half+1, ...]``
    (``reshape(H, 2, D/2, ...).swapaxes(1, 2)``); this restores ``[r0 .. r_{D-1}]``.
    """
    rest = w.shape[1:]
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def unpermute_q(w: torch.Tensor, c) -> torch.Tensor:
    return _unpermute(c.num_attention_heads, w)


def unpermute_k(w: torch.Tensor, c) -> torch.Tensor:
    return _unpermute(c.num_key_value_heads, w)


def minus_one(w: torch.Tensor, c) -> torch.Tensor:
    """llama.cpp stores Gemma norm weights as (1 + w) so its runtime can scale by the stored value;
    fuelpipe's unit-offset RMSNorm wants w back."""
    return w - 1.0

