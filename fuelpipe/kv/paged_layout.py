"""kv=paged: one block pool, each sequence a block table into it (vLLM-style), one sequence or a batch.

The same step serves one sequence and a ragged batch (a table row each): ``paged`` on the tensor
path, ``paged_symbol`` (only the live blocks gathered) on the symbol path; fresh prompts are
prefilled packed into one row (``packed_paged``).
"""
from __future__ import annotations

from dataclasses import dataclass

from fuelpipe.kv.batch import PagedBatch
from fuelpipe.kv.contiguous_layout import check_heads, per_layer, refuse_mla
from fuelpipe.kv.layout import KvLayout, StepSignature
from fuelpipe.kv.packed_views import PackedPagedKv
from fuelpipe.kv.paged import PagedSequence
from fuelpipe.kv.views import PagedKv, PagedPrefixKv


def _dims(bb) -> tuple[int, int]:
    return bb.dims.n_kv_heads, bb.dims.head_dim


PAGED = StepSignature("paged", ("write_index", "block_table"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: PagedKv(k, v, a["write_index"], a["block_table"], *_dims(bb))))
PAGED_SYMBOL = StepSignature("paged_symbol", ("write_index", "block_table", "attended_len"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: PagedPrefixKv(k, v, a["write_index"], a["block_table"], *_dims(bb), a["attended_len"])))
PACKED_PAGED = StepSignature("packed_paged", ("write_index", "last_index"), lambda bb, a, kv: per_layer(
    bb, kv, lambda i, k, v: PackedPagedKv(k, v, a["write_index"], *_dims(bb))))


@dataclass(frozen=True)
class PagedLayout(KvLayout):
    name = "paged"

    def signatures(self):
        return (PAGED, PAGED_SYMBOL, PACKED_PAGED)

    def signature(self, offset_mode: str, *, batched: bool = False, packed: bool = False) -> StepSignature:
        if packed:
            return PACKED_PAGED
        return PAGED_SYMBOL if offset_mode == "symbol" else PAGED

    def serves(self, model) -> list[str]:
        return refuse_mla(model, self.name)

    def check_cache(self, model, cache) -> None:
        super().check_cache(model, cache)
        check_heads(model, cache.pool)

    def new_cache(self, ctx, spec, max_seq_len: int, dtype=None) -> PagedSequence:
        """A pool of its own per request (requests are separate allocations), of ``spec.num_blocks`` when set."""
        cap = spec.blocks_for(max_seq_len)
        return ctx.new_pool(spec.num_blocks or cap + 1, spec.block_size, dtype).sequence(cap)

    def new_batch(self, ctx, spec, max_batch: int, max_seq_len: int, dtype=None) -> PagedBatch:
        """One pool shared by the rows: ``spec.num_blocks`` blocks, else every row at full length (+ the null block)."""
        cap = spec.blocks_for(max_seq_len)
        pool = ctx.new_pool(spec.num_blocks or max_batch * cap + 1, spec.block_size, dtype)
        return ctx.new_paged_batch(pool, max_batch, cap)


KV_LAYOUT = PagedLayout()
