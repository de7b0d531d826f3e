"""Per-layer KV views used inside a step: where this token's K/V are written and what is attended.

Two ways of carrying the write offset (both stay alive, see README):

* ``TensorOffsetKv`` (the "device-offset" path): the offset is an int64 tensor
  input. Shapes never depend on the position, attention covers the whole
  capacity under the mask, and the step is CUDA-graph capturable.
* ``SymbolOffsetKv`` (the "symbol" path): ``cached_len`` and ``attended_len``
  are host integers bound per pass. The write lands at ``cached_len`` and
  attention reads only the live prefix ``[0, attended_len)``. Both bindings
  are load-bearing here; binding either wrong changes the logits.
"""
from __future__ import annotations

import torch


class TensorOffsetKv:
    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, write_index: torch.Tensor) -> None:
        self.k_buf = k_buf  # [1, Hkv, S, D]
        self.v_buf = v_buf  # [1, Hkv, S, D]
        self.write_index = write_index  # [T] int64

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v: [1, Hkv, T, D]. Returns (K, V [1, Hkv, S, D], mask [1, 1, T, S]).

        The read uses the tensor returned by the in-place write, so the write is
        a data dependency of attention and no dead-code pass can drop it.
        """
        keys = self.k_buf.index_copy_(2, self.write_index, k)
        values = self.v_buf.index_copy_(2, self.write_index, v)
        return keys, values, mask


class SymbolOffsetKv:
    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, cached_len, attended_len) -> None:
        self.k_buf = k_buf
        self.v_buf = v_buf
        self.cached_len = cached_len  # int: first position written this pass
        self.attended_len = attended_len  # int: live prefix length including this pass

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        t = k.shape[2]
        self.k_buf.narrow(2, self.cached_len, t).copy_(k)
        self.v_buf.narrow(2, self.cached_len, t).copy_(v)
        keys = self.k_buf.narrow(2, 0, self.attended_len)
        values = self.v_buf.narrow(2, 0, self.attended_len)
        return keys, values, mask.narrow(-1, 0, self.attended_len)
