"""The decode step every family runs: embed, per-layer apply, final norm + head.

One function, ``run_step``, for all families and both offset paths. The two
``nn.Module`` wrappers only fix the program's input signature so a backend
(fx / inductor) sees stable, re-bindable inputs:

    token_ids  [B, T]                      int64
    rope_cos   [n_rope_specs, B, T, rot]   model dtype
    rope_sin   [n_rope_specs, B, T, rot]   model dtype
    mask       [n_mask_variants, B, 1, T, S] model dtype (additive)
    write_index [T] int64              (tensor-offset and latent paths; B = 1)
                [B*T] int64            (paged paths: flattened pool offsets)
                [B, T] int64           (batch-slot paths: the position each row writes)
    slot_ids   [B] int64               (batch-slot paths: the cache slot each row owns)
    cached_len, attended_len  int      (symbol paths; a batch's attended_len is its longest row's)
    block_table [B, max_blocks_cap]    int64 (paged paths)
    kv         [k0, v0, k1, v1, ...]   the KV buffers the program is bound to

A packed prompt step (``packed*`` kinds, ``fuelpipe.batch.packed_prefill``)
runs several fresh sequences' prompts as one row of N tokens (B = 1, T = N):
write_index and slot_ids are per token [N], the mask [V, 1, 1, N, N] is
block-diagonal causal, and ``last_index [n]`` names each prompt's last token,
whose logits it returns.

One sequence is B = 1. A batch step (``batch*`` kinds) serves B rows of
different lengths at once (ragged); every row has its own positions, RoPE
rows, masks, write offsets and slot or block-table row.

Weights are the program's baked state; KV buffers are its bound state and are
written in place.
"""
from __future__ import annotations

import torch
from torch import nn

from fuelpipe.backbone import DecodeBackbone, LayerInputs
from fuelpipe.kv.batch_views import LatentSlotKv, SlotKv, SlotPrefixKv
from fuelpipe.kv.packed_views import PackedLatentKv, PackedPagedKv, PackedSlotKv
from fuelpipe.kv.views import LatentKv, PagedKv, PagedPrefixKv, SymbolOffsetKv, TensorOffsetKv


def run_step(
    backbone: DecodeBackbone,
    token_ids: torch.Tensor,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    mask: torch.Tensor,
    kv_views: list,
    last_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of each row's last position, [B, vocab] f32; with ``last_index [n]`` (a packed step, B = 1),
    of those positions of the one row, [n, vocab] f32."""
    n_specs = len(backbone.rope_plan.specs)
    cos = [rope_cos[i][:, None] for i in range(n_specs)]  # each [B, 1, T, rot]: broadcast over heads
    sin = [rope_sin[i][:, None] for i in range(n_specs)]
    masks = [mask[i] for i in range(len(backbone.mask_plan.variants))]  # each [B, 1, T, S]
    layer_spec = backbone.rope_plan.layer_spec
    layer_variant = backbone.mask_plan.layer_variant
    h = backbone.embed(token_ids)  # [B, T, hidden]
    for i in range(backbone.dims.n_layers):
        inputs = LayerInputs(
            cos=cos[layer_spec[i]], sin=sin[layer_spec[i]], mask=masks[layer_variant[i]], kv=kv_views[i]
        )
        h = backbone.apply_layer(i, h, inputs)
    logits = backbone.final(last_positions(h, last_index))  # [B or n, 1, vocab]
    return logits[:, 0, :].float()


def last_positions(h: torch.Tensor, last_index: torch.Tensor | None) -> torch.Tensor:
    """h [B, T, hidden] -> [B, 1, hidden], each row's last position; with ``last_index [n]`` (a packed step,
    B = 1) those positions of the one row, [n, 1, hidden]. An fx leaf: a pass can tell that what follows
    (the head) sees one row per sequence, not one per token (``fuelpipe.plan.linear_forms``)."""
    return h[:, -1:, :] if last_index is None else h[0].index_select(0, last_index)[:, None, :]


torch.fx.wrap("last_positions")


class _Step(nn.Module):
    """What every step signature shares: the backbone, and how its KV views treat masked slots."""

    def __init__(self, backbone: DecodeBackbone, *, keep_masked_garbage: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.keep_masked_garbage = keep_masked_garbage  # True only under the UNSAFE_MASKED_SLOTS fault

    def _run(self, token_ids, rope_cos, rope_sin, mask, views: list, last_index=None) -> torch.Tensor:
        live_memo: dict = {}  # one per call: each mask's live slots computed once for all layers
        for view in views:
            view.live_memo = live_memo
            if self.keep_masked_garbage:
                view.keep_masked_garbage = True
        return run_step(self.backbone, token_ids, rope_cos, rope_sin, mask, views, last_index)


class TensorOffsetStep(_Step):
    """Step program signature for the device-offset path (offset is a tensor input)."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, kv):
        views = [TensorOffsetKv(kv[2 * i], kv[2 * i + 1], write_index) for i in range(self.backbone.dims.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class SymbolOffsetStep(_Step):
    """Step program signature for the symbol path (offsets are per-pass host integers)."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, cached_len: int, attended_len: int, kv):
        views = [
            SymbolOffsetKv(kv[2 * i], kv[2 * i + 1], cached_len, attended_len)
            for i in range(self.backbone.dims.n_layers)
        ]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class PagedStep(_Step):
    """Step program signature for a paged pool: flattened write offsets plus the padded block table."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, block_table, kv):
        d = self.backbone.dims
        views = [
            PagedKv(kv[2 * i], kv[2 * i + 1], write_index, block_table, d.n_kv_heads, d.head_dim)
            for i in range(d.n_layers)
        ]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class PagedPrefixStep(_Step):
    """Paged pool on the symbol path: also takes the live length, and attends only the live blocks."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, block_table, attended_len: int, kv):
        d = self.backbone.dims
        views = [
            PagedPrefixKv(kv[2 * i], kv[2 * i + 1], write_index, block_table, d.n_kv_heads, d.head_dim, attended_len)
            for i in range(d.n_layers)
        ]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class LatentStep(_Step):
    """Step program signature for a latent (MLA) cache: tensor write offsets, two slots per layer."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, kv):
        views = [LatentKv(kv[2 * i], kv[2 * i + 1], write_index) for i in range(self.backbone.dims.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class BatchSlotStep(_Step):
    """Batch-slot cache, tensor-offset path: each row writes (slot_ids[b], write_index[b]) and attends its slot."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, slot_ids, kv):
        views = [SlotKv(kv[2 * i], kv[2 * i + 1], write_index, slot_ids) for i in range(self.backbone.dims.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class BatchSlotPrefixStep(_Step):
    """Batch-slot cache on the symbol path: also takes the longest row's length, and attends only that prefix."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, slot_ids, attended_len: int, kv):
        views = [
            SlotPrefixKv(kv[2 * i], kv[2 * i + 1], write_index, slot_ids, attended_len)
            for i in range(self.backbone.dims.n_layers)
        ]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class BatchLatentStep(_Step):
    """Batch-slot latent (MLA) cache: tensor write offsets per row, two latent slots per layer."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, slot_ids, kv):
        views = [
            LatentSlotKv(kv[2 * i], kv[2 * i + 1], write_index, slot_ids) for i in range(self.backbone.dims.n_layers)
        ]
        return self._run(token_ids, rope_cos, rope_sin, mask, views)


class PackedSlotStep(_Step):
    """Packed prompts into a batch-slot cache: token n writes (slot_ids[n], write_index[n])."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, slot_ids, last_index, kv):
        views = [PackedSlotKv(kv[2 * i], kv[2 * i + 1], write_index, slot_ids)
                 for i in range(self.backbone.dims.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views, last_index)


class PackedPagedStep(_Step):
    """Packed prompts into a paged pool: token n writes the flattened offset write_index[n]."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, last_index, kv):
        d = self.backbone.dims
        views = [PackedPagedKv(kv[2 * i], kv[2 * i + 1], write_index, d.n_kv_heads, d.head_dim)
                 for i in range(d.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views, last_index)


class PackedLatentStep(_Step):
    """Packed prompts into a batch-slot latent (MLA) cache."""

    def forward(self, token_ids, rope_cos, rope_sin, mask, write_index, slot_ids, last_index, kv):
        views = [PackedLatentKv(kv[2 * i], kv[2 * i + 1], write_index, slot_ids)
                 for i in range(self.backbone.dims.n_layers)]
        return self._run(token_ids, rope_cos, rope_sin, mask, views, last_index)


STEP_KINDS = {
    "tensor": TensorOffsetStep,
    "symbol": SymbolOffsetStep,
    "paged": PagedStep,
    "paged_symbol": PagedPrefixStep,
    "latent": LatentStep,
    "batch": BatchSlotStep,
    "batch_symbol": BatchSlotPrefixStep,
    "batch_latent": BatchLatentStep,
    "packed_batch": PackedSlotStep,
    "packed_paged": PackedPagedStep,
    "packed_latent": PackedLatentStep,
}
# The packed prompt step of each batch cache kind.
PACKED_KIND_OF = {"batch": "packed_batch", "paged": "packed_paged", "batch_latent": "packed_latent"}
# Step kinds that take per-pass host integers (compiled with symbolic sizes by inductor).
SYMBOLIC_KINDS = ("symbol", "paged_symbol", "batch_symbol")


def step_module_for(backbone: DecodeBackbone, step_kind: str, *, keep_masked_garbage: bool = False) -> nn.Module:
    return STEP_KINDS[step_kind](backbone, keep_masked_garbage=keep_masked_garbage)


def step_args(step_kind: str, buffers, host, kv: list) -> tuple:
    """The program's positional arguments for one call, in its signature's order."""
    b = buffers
    if step_kind in ("tensor", "latent"):
        return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, b.write_index, kv)
    if step_kind == "symbol":
        return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, host.cached_len, host.attended_len, kv)
    if step_kind in ("batch", "batch_latent"):
        return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, b.write_index, b.slot_ids, kv)
    if step_kind == "batch_symbol":
        return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, b.write_index, b.slot_ids, host.attended_len, kv)
    if step_kind == "paged_symbol":
        return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, b.write_index, b.block_table, host.attended_len, kv)
    return (b.token_ids, b.rope_cos, b.rope_sin, b.mask, b.write_index, b.block_table, kv)
