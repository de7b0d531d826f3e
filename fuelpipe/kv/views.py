"""Per-layer KV views used inside a step: where this token's K/V are written and what is attended.

Two ways of carrying the write offset (both stay alive, see docs/architecture.md):

* ``TensorOffsetKv`` (the "device-offset" path): the offset is an int64 tensor
  input. Shapes never depend on the position, attention covers the whole
  capacity under the mask, and the step is CUDA-graph capturable.
* ``SymbolOffsetKv`` (the "symbol" path): ``cached_len`` and ``attended_len``
  are host integers bound per pass. The write lands at ``cached_len`` and
  attention reads only the live prefix ``[0, attended_len)``. Both bindings
  are load-bearing here; binding either wrong changes the logits.

Every view returns only attendable data: a slot that no query of the step may
attend is returned as exactly 0 (``without_masked_slots``), whatever the
buffer holds there (a recycled block's NaN, a reused cache's old rows, the
null block).

The one-sequence contiguous views also ``attend``: write, then one traced
``slot_attention`` call over the written buffer (one slot, slot 0), which the
``slot_attention_kernel`` pass hands to the C++ kernel. The kernel reads the
live keys where they lie and skips every masked position, instead of a masked
copy of the whole capacity plus SDPA over it.
"""
from __future__ import annotations

import torch

from fuelpipe.kv import slot_attention as _attention  # called through the module: fx patches its leaf there
from fuelpipe.masks import live_slots_as, without_masked_slots


class CleansMaskedSlots:
    """Mixin: the masked-slot cleaning every view applies to what it returns."""

    # Shared by every view of one step call (set by the step module): the live-slot vector of a
    # mask is computed once per step, not once per layer and slot. Values hold the mask itself,
    # so its id cannot be recycled while the memo lives.
    live_memo: dict | None = None

    def _visible(self, x: torch.Tensor, mask: torch.Tensor, slot_dim: int) -> torch.Tensor:
        memo = self.live_memo
        if memo is None:
            return without_masked_slots(x, mask, slot_dim)
        key = (id(mask), slot_dim)
        if key not in memo:
            memo[key] = (mask, live_slots_as(mask, slot_dim))
        return torch.where(memo[key][1], x, 0.0)


class _AttendsInPlace(CleansMaskedSlots):
    """Mixin of the one-sequence contiguous views: ``_written`` writes k, v and returns the written buffers
    [1, Hkv, S', D] and mask [1, 1, T, S'] attention reads; ``attend`` attends them in one traced call."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
        """Write k, v [1, Hkv, T, D]; q [1, H, T, D] attends under mask [1, 1, T, S] -> [1, H, T, Dv].

        One traced ``slot_attention`` call over the written buffers (the sequence is slot 0)."""
        k_buf, v_buf, mask = self._written(k, v, mask)
        return _attention.slot_attention(q, k_buf, v_buf, mask.new_zeros(1, dtype=torch.int64), mask, scale)


class TensorOffsetKv(_AttendsInPlace):
    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, write_index: torch.Tensor) -> None:
        self.k_buf = k_buf  # [1, Hkv, S, D]  (one sequence; a batch uses fuelpipe.kv.batch_views)
        self.v_buf = v_buf  # [1, Hkv, S, D]
        self.write_index = write_index  # [T] int64

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v: [1, Hkv, T, D]. Returns (K, V [1, Hkv, S, D], mask [1, 1, T, S]).

        The read uses the tensor returned by the in-place write, so the write is
        a data dependency of attention and no dead-code pass can drop it.
        """
        keys, values, mask = self._written(k, v, mask)
        return self._visible(keys, mask, 2), self._visible(values, mask, 2), mask

    def _written(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        return self.k_buf.index_copy_(2, self.write_index, k), self.v_buf.index_copy_(2, self.write_index, v), mask


class SymbolOffsetKv(_AttendsInPlace):
    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, cached_len, attended_len) -> None:
        self.k_buf = k_buf
        self.v_buf = v_buf
        self.cached_len = cached_len  # int: first position written this pass
        self.attended_len = attended_len  # int: live prefix length including this pass

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        keys, values, mask = self._written(k, v, mask)
        return self._visible(keys, mask, 2), self._visible(values, mask, 2), mask

    def _written(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        t = k.shape[2]
        self.k_buf.narrow(2, self.cached_len, t).copy_(k)
        self.v_buf.narrow(2, self.cached_len, t).copy_(v)
        keys = self.k_buf.narrow(2, 0, self.attended_len)
        values = self.v_buf.narrow(2, 0, self.attended_len)
        return keys, values, mask.narrow(-1, 0, self.attended_len)


class PagedKv(CleansMaskedSlots):
    """Paged pool view: write at flattened offsets, read the sequence's blocks through its table.

    k_pool, v_pool: [NB, bs, Hkv, D]; write_index [B*T] = physical_block * bs + slot (row-major);
    block_table [B, cap] (padding names the null block, masked out by the mask row). One sequence
    is B = 1; a ragged batch is one table row per sequence.
    """

    def __init__(self, k_pool, v_pool, write_index, block_table, n_kv_heads: int, head_dim: int) -> None:
        self.k_pool, self.v_pool = k_pool, v_pool
        self.write_index, self.block_table = write_index, block_table
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim

    def _write_and_gather(self, pool, x):
        rows = x.transpose(1, 2).flatten(0, 1)  # [B*T, Hkv, D]
        flat = pool.view(-1, self.n_kv_heads, self.head_dim).index_copy_(0, self.write_index, rows)
        blocks = flat.view(pool.shape)[self.block_table]  # [B, cap, bs, Hkv, D]
        return blocks.flatten(1, 2).transpose(1, 2)  # [B, Hkv, cap*bs, D]

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        keys, values = self._write_and_gather(self.k_pool, k), self._write_and_gather(self.v_pool, v)
        return self._visible(keys, mask, 2), self._visible(values, mask, 2), mask


class PagedPrefixKv(PagedKv):
    """Paged view on the symbol path: gathers only the blocks holding live positions.

    ``attended_len`` is a per-pass host integer (as on ``SymbolOffsetKv``); the table is cut
    to its first ceil(attended_len / block_size) entries and the mask to as many positions, so
    a step reads what the sequence holds, not the whole padded table (in a batch: what its
    longest row holds; shorter rows' tails are masked). The read still uses the
    in-place write's result, so the write stays a data dependency.
    """

    def __init__(self, k_pool, v_pool, write_index, block_table, n_kv_heads: int, head_dim: int, attended_len) -> None:
        super().__init__(k_pool, v_pool, write_index, block_table, n_kv_heads, head_dim)
        block = k_pool.shape[1]
        self.live_blocks = (attended_len + block - 1) // block  # int (a symbol under tracing)
        self.live_width = self.live_blocks * block

    def _write_and_gather(self, pool, x):
        rows = x.transpose(1, 2).flatten(0, 1)  # [B*T, Hkv, D]
        flat = pool.view(-1, self.n_kv_heads, self.head_dim).index_copy_(0, self.write_index, rows)
        live = self.block_table.narrow(1, 0, self.live_blocks)  # [B, live_blocks]
        blocks = flat.view(pool.shape)[live]  # [B, live_blocks, bs, Hkv, D]
        return blocks.flatten(1, 2).transpose(1, 2)  # [B, Hkv, live_width, D]

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        keys, values = self._write_and_gather(self.k_pool, k), self._write_and_gather(self.v_pool, v)
        mask = mask.narrow(-1, 0, self.live_width)
        return self._visible(keys, mask, 2), self._visible(values, mask, 2), mask


class LatentKv(CleansMaskedSlots):
    """Latent (MLA) view: slot 0 the normalised KV latent [S, r], slot 1 the RoPE key [S, rope].

    Offsets ride the tensor path; the read is the in-place write's result (DCE-safe).
    """

    def __init__(self, latent_buf, rope_key_buf, write_index) -> None:
        self.latent_buf = latent_buf  # [S, r]
        self.rope_key_buf = rope_key_buf  # [S, rope]
        self.write_index = write_index  # [T] int64

    def write_and_read_latent(self, latent: torch.Tensor, rope_key: torch.Tensor, mask: torch.Tensor):
        """latent [1, T, r], rope_key [1, T, rope] -> (all latents [1, S, r], all rope keys [1, S, rope], mask)."""
        latents = self.latent_buf.index_copy_(0, self.write_index, latent[0])[None]
        rope_keys = self.rope_key_buf.index_copy_(0, self.write_index, rope_key[0])[None]
        return self._visible(latents, mask, 1), self._visible(rope_keys, mask, 1), mask
