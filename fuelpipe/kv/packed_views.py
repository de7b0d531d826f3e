"""Per-layer KV views of a packed prompt step: several fresh sequences' prompts as one row of N tokens.

A packed step serves prompts that start at position 0 (sequences that have
just joined a batch). Every key a prompt token may attend is then a token of
the same step, so attention runs over the step's own K/V (``[1, Hkv, N, D]``)
under a block-diagonal causal mask, and the cache is only written: token n
lands at (its sequence's slot, its position) or at its paged offset.

The write is an in-place ``index_put_`` / ``index_copy_`` whose result is not
read; ``eliminate_dead_code_keeping_writes`` keeps it (torch.fx's default DCE,
the NAIVE_DCE negative control, drops it and the next decode step reads an
empty cache). Nothing masked reaches attention from the cache, so there is no
masked slot to clean: the step's own K/V are finite wherever the model is.
"""
from __future__ import annotations

import torch


class PackedSlotKv:
    """Batch-slot cache K/V ``[N_slots, Hkv, S, D]``: token n writes (slot_ids[n], :, write_pos[n])."""

    def __init__(self, k_buf, v_buf, write_pos, slot_ids) -> None:
        self.k_buf, self.v_buf = k_buf, v_buf  # [N_slots, Hkv, S, D]
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [N], [N]

    def _write(self, buf: torch.Tensor, x: torch.Tensor) -> None:
        heads = torch.arange(x.shape[1], device=x.device)  # [Hkv]
        index = (self.slot_ids[None, :], heads[:, None], self.write_pos[None, :])  # broadcast to [Hkv, N]
        buf.index_put_(index, x[0])  # x[0]: [Hkv, N, D]

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v: [1, Hkv, N, D]; mask [1, 1, N, N]. Returns the step's own (k, v, mask)."""
        self._write(self.k_buf, k)
        self._write(self.v_buf, v)
        return k, v, mask


class PackedPagedKv:
    """Paged pool K/V ``[NB, bs, Hkv, D]``: token n writes the flattened offset write_index[n]."""

    def __init__(self, k_pool, v_pool, write_index, n_kv_heads: int, head_dim: int) -> None:
        self.k_pool, self.v_pool, self.write_index = k_pool, v_pool, write_index  # write_index [N]
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim

    def _write(self, pool: torch.Tensor, x: torch.Tensor) -> None:
        rows = x[0].transpose(0, 1)  # [N, Hkv, D]
        pool.view(-1, self.n_kv_heads, self.head_dim).index_copy_(0, self.write_index, rows)

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        self._write(self.k_pool, k)
        self._write(self.v_pool, v)
        return k, v, mask


class PackedLatentKv:
    """Batch-slot latent (MLA) cache: latent ``[N_slots, S, r]`` and RoPE key ``[N_slots, S, rope]``."""

    def __init__(self, latent_buf, rope_key_buf, write_pos, slot_ids) -> None:
        self.latent_buf, self.rope_key_buf = latent_buf, rope_key_buf
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [N], [N]

    def write_and_read_latent(self, latent: torch.Tensor, rope_key: torch.Tensor, mask: torch.Tensor):
        """latent [1, N, r], rope_key [1, N, rope] -> the step's own (latent, rope_key, mask)."""
        index = (self.slot_ids, self.write_pos)  # [N]
        self.latent_buf.index_put_(index, latent[0])
        self.rope_key_buf.index_put_(index, rope_key[0])
        return latent, rope_key, mask
