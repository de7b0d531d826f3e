"""kv=latent: an MLA family's compressed slots (the normalised KV latent and the RoPE key) per position.

Always on the tensor-offset path: ``latent`` for one sequence, ``batch_latent`` for a batch (a slot
per sequence), ``packed_latent`` for fresh prompts packed into one row.
"""
from __future__ import annotations

from dataclasses import dataclass

from fuelpipe.errors import ConfigError
from fuelpipe.kv.batch import BatchLatentCache
from fuelpipe.kv.batch_views import LatentSlotKv
from fuelpipe.kv.contiguous_layout import per_layer
from fuelpipe.kv.latent import LatentKvCache
from fuelpipe.kv.layout import KvLayout, StepSignature
from fuelpipe.kv.packed_views import PackedLatentKv
from fuelpipe.kv.views import LatentKv

LATENT = StepSignature("latent", ("write_index",), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: LatentKv(k, v, a["write_index"])))
BATCH_LATENT = StepSignature("batch_latent", ("write_index", "slot_ids"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: LatentSlotKv(k, v, a["write_index"], a["slot_ids"])))
PACKED_LATENT = StepSignature("packed_latent", ("write_index", "slot_ids", "last_index"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: PackedLatentKv(k, v, a["write_index"], a["slot_ids"])))


@dataclass(frozen=True)
class LatentLayout(KvLayout):
    name = "latent"
    for_mla = True

    def signatures(self):
        return (LATENT, BATCH_LATENT, PACKED_LATENT)

    def signature(self, offset_mode: str, *, batched: bool = False, packed: bool = False) -> StepSignature:
        if packed:
            return PACKED_LATENT
        return BATCH_LATENT if batched else LATENT

    def serves(self, model) -> list[str]:
        if model.latent_slots is None:
            return [f"{model.family} is not an MLA family: a latent cache cannot serve it (use contiguous or paged)"]
        return []

    def check_cache(self, model, cache) -> None:
        super().check_cache(model, cache)
        if cache.slot_trailing != model.latent_slots:
            raise ConfigError(f"{model.family} needs a latent cache with slots {model.latent_slots}, got a latent "
                              f"cache with slots {cache.slot_trailing}")

    def new_cache(self, ctx, spec, max_seq_len: int, dtype=None) -> LatentKvCache:
        self.check_serves(ctx.model)
        return LatentKvCache(ctx.model.dims.n_layers, ctx.model.latent_slots,
                             ctx.check_positions("new_cache", max_seq_len), dtype or ctx.dtype, ctx.device)

    def new_batch(self, ctx, spec, max_batch: int, max_seq_len: int, dtype=None) -> BatchLatentCache:
        self.check_serves(ctx.model)
        return BatchLatentCache(ctx.model.dims.n_layers, ctx.model.latent_slots, max_batch,
                                ctx.check_positions("new_batch_cache", max_seq_len), dtype or ctx.dtype, ctx.device)


KV_LAYOUT = LatentLayout()
