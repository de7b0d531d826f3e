"""kv=contiguous: every sequence owns ``max_seq_len`` positions per layer, written in place.

One sequence decodes on either offset path (``tensor``: the write offset is a tensor input;
``symbol``: host integers, attending the live prefix only). A batch is one slot per sequence
(``batch`` / ``batch_symbol``), and fresh prompts are prefilled packed into one row (``packed_batch``).
"""
from __future__ import annotations

from dataclasses import dataclass

from fuelpipe.errors import ConfigError
from fuelpipe.kv.batch import BatchKvCache
from fuelpipe.kv.batch_views import SlotKv, SlotPrefixKv
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.layout import KvLayout, StepSignature
from fuelpipe.kv.packed_views import PackedSlotKv
from fuelpipe.kv.views import SymbolOffsetKv, TensorOffsetKv


def per_layer(backbone, kv: list, make) -> list:
    """One view per layer from the bound list ``[k0, v0, k1, v1, ...]``: ``make(layer, k_i, v_i)``."""
    return [make(i, kv[2 * i], kv[2 * i + 1]) for i in range(backbone.dims.n_layers)]


TENSOR = StepSignature("tensor", ("write_index",), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: TensorOffsetKv(k, v, a["write_index"])))
SYMBOL = StepSignature("symbol", ("cached_len", "attended_len"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: SymbolOffsetKv(k, v, a["cached_len"], a["attended_len"])))
BATCH = StepSignature("batch", ("write_index", "slot_ids"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: SlotKv(k, v, a["write_index"], a["slot_ids"])))
BATCH_SYMBOL = StepSignature("batch_symbol", ("write_index", "slot_ids", "attended_len"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: SlotPrefixKv(k, v, a["write_index"], a["slot_ids"], a["attended_len"])))
PACKED_BATCH = StepSignature("packed_batch", ("write_index", "slot_ids", "last_index"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: PackedSlotKv(k, v, a["write_index"], a["slot_ids"])))


def check_heads(model, holder) -> None:
    """The (layers, kv heads, head_dim) of a cache's buffers must be the model's."""
    d = model.dims
    got = (holder.n_layers, holder.n_kv_heads, holder.head_dim)
    if got != (d.n_layers, d.n_kv_heads, d.head_dim):
        raise ConfigError(f"cache geometry (layers, kv heads, head_dim) = {got} does not match the model's "
                          f"{(d.n_layers, d.n_kv_heads, d.head_dim)}")


def refuse_mla(model, kind: str) -> list[str]:
    """A per-head K/V layout cannot serve an MLA family, which decodes from latent slots."""
    if model.latent_slots is None:
        return []
    return [f"{model.family} needs a latent cache with slots {model.latent_slots}, got a {kind} cache"]


@dataclass(frozen=True)
class ContiguousLayout(KvLayout):
    name = "contiguous"

    def signatures(self):
        return (TENSOR, SYMBOL, BATCH, BATCH_SYMBOL, PACKED_BATCH)

    def signature(self, offset_mode: str, *, batched: bool = False, packed: bool = False) -> StepSignature:
        if packed:
            return PACKED_BATCH
        if batched:
            return BATCH_SYMBOL if offset_mode == "symbol" else BATCH
        return SYMBOL if offset_mode == "symbol" else TENSOR

    def serves(self, model) -> list[str]:
        return refuse_mla(model, self.name)

    def check_cache(self, model, cache) -> None:
        super().check_cache(model, cache)
        check_heads(model, cache)

    def new_cache(self, ctx, spec, max_seq_len: int, dtype=None) -> ContiguousKvCache:
        self.check_serves(ctx.model)
        d = ctx.model.dims
        return ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim,
                                               ctx.check_positions("new_cache", max_seq_len), dtype or ctx.dtype,
                                               ctx.device)

    def new_batch(self, ctx, spec, max_batch: int, max_seq_len: int, dtype=None) -> BatchKvCache:
        self.check_serves(ctx.model)
        d = ctx.model.dims
        return BatchKvCache(d.n_layers, d.n_kv_heads, d.head_dim, max_batch,
                            ctx.check_positions("new_batch_cache", max_seq_len), dtype or ctx.dtype, ctx.device)


KV_LAYOUT = ContiguousLayout()
