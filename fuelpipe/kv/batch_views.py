"""Per-layer KV views of a batch-slot cache inside a batched step (B rows, one slot each).

Buffers hold every slot: K/V ``[N, Hkv, S, D]``, latents ``[N, S, r]`` (slot 0
is the null slot padding rows write). ``slot_ids [B]`` names the slot of each
row and ``write_pos [B, T]`` the positions each row writes; both are per-token
inputs, so rows may join, leave and sit at different lengths under one plan.
Writes are in place (``index_put_``) and the read gathers the rows' slots from
the write's result, so the write is a data dependency of attention. Masked
slots come back as exactly 0, as in every one-sequence view.
"""
from __future__ import annotations

import torch

from fuelpipe.kv import slot_attention as _attention
from fuelpipe.kv.views import CleansMaskedSlots


def write_rows(buf: torch.Tensor, slot_ids: torch.Tensor, write_pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """buf [N, Hkv, S, D] <- x [B, Hkv, T, D] at (slot_ids[b], h, write_pos[b, t]); returns buf."""
    heads = torch.arange(x.shape[1], device=x.device)  # [Hkv]
    index = (slot_ids[:, None, None], heads[None, :, None], write_pos[:, None, :])  # broadcast to [B, Hkv, T]
    return buf.index_put_(index, x)


class SlotKv(CleansMaskedSlots):
    """Tensor-offset path: every row attends its slot's whole capacity under its mask row."""

    def __init__(self, k_buf, v_buf, write_pos, slot_ids) -> None:
        self.k_buf, self.v_buf = k_buf, v_buf  # [N, Hkv, S, D]
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [B, T], [B]

    def _read(self, written: torch.Tensor) -> torch.Tensor:
        return written.index_select(0, self.slot_ids)  # [B, Hkv, S, D]

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v: [B, Hkv, T, D]; mask [B, 1, T, S]. Returns (K, V [B, Hkv, S, D], mask)."""
        keys = self._read(write_rows(self.k_buf, self.slot_ids, self.write_pos, k))
        values = self._read(write_rows(self.v_buf, self.slot_ids, self.write_pos, v))
        return self._visible(keys, mask, 2), self._visible(values, mask, 2), mask

    def _attended(self, written: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What of a written buffer [N, Hkv, S, D] and the mask [B, 1, T, S] attention reads: all of it."""
        return written, mask

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
        """Write k, v [B, Hkv, T, D]; q [B, H, T, D] attends each row's slot under mask [B, 1, T, S].

        One traced call (``fuelpipe.kv.slot_attention``) over the written buffers, which a pass may
        hand to the C++ kernel."""
        k_buf, cut = self._attended(write_rows(self.k_buf, self.slot_ids, self.write_pos, k), mask)
        v_buf, _ = self._attended(write_rows(self.v_buf, self.slot_ids, self.write_pos, v), mask)
        return _attention.slot_attention(q, k_buf, v_buf, self.slot_ids, cut, scale)


class SlotPrefixKv(SlotKv):
    """Symbol path: ``attended_len`` (the longest row's length, a per-pass host int) cuts what is gathered."""

    def __init__(self, k_buf, v_buf, write_pos, slot_ids, attended_len) -> None:
        super().__init__(k_buf, v_buf, write_pos, slot_ids)
        self.attended_len = attended_len

    def _read(self, written: torch.Tensor) -> torch.Tensor:
        return written.narrow(2, 0, self.attended_len).index_select(0, self.slot_ids)  # [B, Hkv, L, D]

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        return super().write_and_read(k, v, mask.narrow(-1, 0, self.attended_len))

    def _attended(self, written: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return written.narrow(2, 0, self.attended_len), mask.narrow(-1, 0, self.attended_len)


class LatentSlotKv(CleansMaskedSlots):
    """Latent (MLA) slots of a batch: slot 0 the latent [N, S, r], slot 1 the RoPE key [N, S, rope]."""

    def __init__(self, latent_buf, rope_key_buf, write_pos, slot_ids) -> None:
        self.latent_buf, self.rope_key_buf = latent_buf, rope_key_buf
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [B, T], [B]

    def write_and_read_latent(self, latent: torch.Tensor, rope_key: torch.Tensor, mask: torch.Tensor):
        """latent [B, T, r], rope_key [B, T, rope] -> (latents [B, S, r], rope keys [B, S, rope], mask)."""
        index = (self.slot_ids[:, None], self.write_pos)  # [B, T]
        latents = self.latent_buf.index_put_(index, latent).index_select(0, self.slot_ids)
        rope_keys = self.rope_key_buf.index_put_(index, rope_key).index_select(0, self.slot_ids)
        return self._visible(latents, mask, 1), self._visible(rope_keys, mask, 1), mask
