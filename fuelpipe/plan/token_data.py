"""Per-token host data, and the static buffers a held plan rebinds it into.

``compute_token_host`` is the one shared function that turns (position, seq)
into everything a step needs besides weights and KV: token ids, RoPE rows per
distinct spec, the stacked mask variants, the write offset and both symbol
bindings. ``StepBuffers`` are allocated once per held plan and overwritten in
place every token, so the program always reads the same input tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fuelpipe.masks import MaskPlan, mask_variants


@dataclass
class TokenHostData:
    token_ids: torch.Tensor  # [B, T] int64
    rope_cos: torch.Tensor  # [n_specs, B, T, rot] f32 host rows; cast to the model dtype in the step buffers
    rope_sin: torch.Tensor  # [n_specs, B, T, rot] f32 host rows
    mask: torch.Tensor  # [n_variants, B, 1, T, S] model dtype
    write_index: torch.Tensor  # [T] int64; paged [B*T]; batch slots [B, T] (see fuelpipe.step)
    cached_len: int
    attended_len: int
    block_table: torch.Tensor | None = None  # [B, max_blocks_cap] int64 (paged only)
    slot_ids: torch.Tensor | None = None  # [B] int64 (batch-slot caches only)

    @property
    def seq(self) -> int:
        return self.token_ids.shape[1]

    @property
    def batch(self) -> int:
        return self.token_ids.shape[0]


def compute_token_host(
    token_ids: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    mask_plan: MaskPlan,
    start: int,
    width: int,
    dtype: torch.dtype,
    write_index: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> TokenHostData:
    """Host data for queries at positions [start, start+T) over a cache of ``width`` positions.

    ``write_index`` defaults to the contiguous positions; a paged cache passes its flattened offsets.
    ``mask`` is ``mask_variants(mask_plan, start, T, width, dtype)`` when the caller has it already (a decode
    step reads it from a ``MaskRowTable``).
    """
    seq = token_ids.shape[1]
    return TokenHostData(
        token_ids=token_ids,
        rope_cos=cos_table[:, None, start : start + seq],
        rope_sin=sin_table[:, None, start : start + seq],
        mask=mask_variants(mask_plan, start, seq, width, dtype) if mask is None else mask,
        write_index=torch.arange(start, start + seq, dtype=torch.int64) if write_index is None else write_index,
        cached_len=start,
        attended_len=start + seq,
        block_table=block_table,
    )


class StepBuffers:
    """The stable input tensors of one held plan (device-resident, fixed shapes)."""

    def __init__(self, host: TokenHostData, dtype: torch.dtype, device: torch.device) -> None:
        self.token_ids = torch.empty_like(host.token_ids, device=device)
        self.rope_cos = torch.empty(host.rope_cos.shape, dtype=dtype, device=device)
        self.rope_sin = torch.empty(host.rope_sin.shape, dtype=dtype, device=device)
        self.mask = torch.empty(host.mask.shape, dtype=dtype, device=device)
        self.write_index = host.write_index.to(device, copy=True)
        self.block_table = None if host.block_table is None else torch.empty_like(host.block_table, device=device)
        self.slot_ids = None if host.slot_ids is None else torch.empty_like(host.slot_ids, device=device)

    def load(self, host: TokenHostData) -> None:
        self.token_ids.copy_(host.token_ids, non_blocking=True)
        self.rope_cos.copy_(host.rope_cos, non_blocking=True)
        self.rope_sin.copy_(host.rope_sin, non_blocking=True)
        self.mask.copy_(host.mask, non_blocking=True)
        self.write_index.copy_(host.write_index, non_blocking=True)
        if self.block_table is not None:
            self.block_table.copy_(host.block_table, non_blocking=True)
        if self.slot_ids is not None:
            self.slot_ids.copy_(host.slot_ids, non_blocking=True)

    def nbytes(self) -> int:
        """Bytes of the plan's own input buffers (what holding the plan costs beyond weights and KV)."""
        held = (self.token_ids, self.rope_cos, self.rope_sin, self.mask, self.write_index, self.block_table,
                self.slot_ids)
        return sum(t.numel() * t.element_size() for t in held if t is not None)
