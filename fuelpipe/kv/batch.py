"""Batched KV: one allocation serving many sequences, one row per sequence in a batched step.

Three strategies, one protocol (what ``fuelpipe.batch`` and the held plans read): the two slot caches
build on ``batch_slots.SlotBatchCache``; ``PagedBatch`` has the same methods (duck-typed) over a block pool:

* ``BatchKvCache``: the batch-slot contiguous buffer. Per layer K and V are
  ``[n_slots + 1, n_kv_heads, max_seq_len, head_dim]``; slot 0 is the null
  slot (never handed out), the only place a padding row may write.
* ``BatchLatentCache``: the same for MLA's latent slots, ``[n_slots + 1, max_seq_len, *trailing]``.
* ``PagedBatch``: sequences of one ``KvBlockPool``; a step stacks their block
  tables into ``[B, max_blocks_cap]`` and padding rows name the null block.

A sequence's handle (``SlotCache``, ``LatentSlotCache``, or a ``PagedSequence``)
is also a single-sequence cache over its slot's views, so a joining request is
prefilled by the ordinary one-sequence prefill, beside the running batch.
``release`` returns a slot (or its blocks) at once.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from fuelpipe.errors import KvCacheError
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.contiguous import ContiguousKvCache, KvLayer
from fuelpipe.kv.latent import LatentKvCache
from fuelpipe.kv.paged import NULL_BLOCK, KvBlockPool, KvOutOfBlocksError, PagedSequence, PoolFacing
from fuelpipe.kv.batch_slots import KvOutOfSlotsError, SlotAllocator, SlotBatchCache
from fuelpipe.kv.sizes import check_dtype, check_size

class BatchKvCache(SlotBatchCache):
    """Batch-slot contiguous KV (the seeds' ``alloc_batched_kv``) plus one null slot for padding rows."""

    kv_layout = "contiguous"

    def __init__(self, n_layers, n_kv_heads, head_dim, n_slots, max_seq_len, dtype=torch.float32, device="cpu"):
        self.n_layers, self.n_kv_heads, self.head_dim, n_slots, self.max_seq_len = (
            check_size("BatchKvCache", name, v) for name, v in (
                ("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim), ("n_slots", n_slots),
                ("max_seq_len", max_seq_len)))
        self.dtype = check_dtype("BatchKvCache", dtype)
        shape = (n_slots + 1, self.n_kv_heads, self.max_seq_len, self.head_dim)  # [N, Hkv, S, D]
        dev = torch.device(device)
        self._bound = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(2 * self.n_layers)]
        self._allocator = SlotAllocator(n_slots, "BatchKvCache")
        self._init_identity()

    def plan_geometry(self, bucket: int, seq: int) -> tuple:
        return (("bucket", bucket), ("seq", seq), ("slots", self.max_rows + 1), ("max_seq_len", self.max_seq_len))

    def slot_handle(self, slot: int) -> "SlotCache":
        return SlotCache(self, slot)


class SlotCache(ContiguousKvCache):
    """One sequence's slot of a ``BatchKvCache``, usable as a one-sequence cache (prefill, solo decode).

    Its layers are views ``[1, Hkv, S, D]`` of the batch buffers; it is its own allocation for plan
    keys (a plan built on one slot is never silently run on another), and it cannot replace its
    storage: the storage belongs to the batch cache.
    """

    def __init__(self, batch: BatchKvCache, slot: int) -> None:
        super().__init__(batch.n_layers, batch.n_kv_heads, batch.head_dim, None, None, None)
        self.batch, self.slot, self.released = batch, slot, False
        self.max_seq_len, self.dtype = batch.max_seq_len, batch.dtype
        k_v = batch.bound_tensors()
        self.layers = [KvLayer(k_v[2 * i][slot : slot + 1], k_v[2 * i + 1][slot : slot + 1])
                       for i in range(batch.n_layers)]
        self._device_location = batch.device_location

    def _refuse(self, what: str) -> None:
        raise KvCacheError(f"SlotCache.{what}: a batch slot's storage belongs to its BatchKvCache; "
                           "release the slot and acquire another instead")

    def clear(self) -> None:
        self._refuse("clear")

    def set_layer(self, index, k, v) -> None:
        self._refuse("set_layer")

    def check_room(self, start: int, n: int) -> None:
        if self.released:
            raise KvCacheError(f"SlotCache: slot {self.slot} was released; acquire a new one")
        super().check_room(start, n)


class BatchLatentCache(SlotBatchCache):
    """Batch-slot latent (MLA) KV: per layer and latent slot ``[n_slots + 1, max_seq_len, *trailing]``."""

    kv_layout = "latent"

    def __init__(self, n_layers, slot_trailing, n_slots, max_seq_len, dtype=torch.float32, device="cpu"):
        self.n_layers, n_slots, self.max_seq_len = (
            check_size("BatchLatentCache", name, v) for name, v in (
                ("n_layers", n_layers), ("n_slots", n_slots), ("max_seq_len", max_seq_len)))
        self.dtype = check_dtype("BatchLatentCache", dtype)
        self.slot_trailing = tuple(tuple(int(d) for d in t) for t in slot_trailing)
        dev = torch.device(device)
        self._bound = [torch.zeros((n_slots + 1, self.max_seq_len, *t), dtype=self.dtype, device=dev)
                       for _ in range(self.n_layers) for t in self.slot_trailing]
        self._allocator = SlotAllocator(n_slots, "BatchLatentCache")
        self._init_identity()

    def plan_geometry(self, bucket: int, seq: int) -> tuple:
        return (("bucket", bucket), ("seq", seq), ("slots", self.max_rows + 1), ("max_seq_len", self.max_seq_len),
                ("latent", self.slot_trailing))

    def slot_handle(self, slot: int) -> "LatentSlotCache":
        return LatentSlotCache(self, slot)


class LatentSlotCache(LatentKvCache):
    """One sequence's slot of a ``BatchLatentCache``, usable as a one-sequence latent cache."""

    def __init__(self, batch: BatchLatentCache, slot: int) -> None:
        self.batch, self.slot, self.released = batch, slot, False
        super().__init__(batch.n_layers, batch.slot_trailing, batch.max_seq_len, batch.dtype,
                         batch.device_location or "cpu")

    def _allocate(self) -> None:  # views of the batch buffers, never storage of its own
        n = len(self.slot_trailing)
        bound = self.batch.bound_tensors()
        self.slots = [[bound[n * layer + s][self.slot] for s in range(n)] for layer in range(self.n_layers)]
        self.versions = [[0] * n for _ in range(self.n_layers)]
        self._alloc_id = KvAllocId.mint()
        self._device_location = self.batch.device_location

    def clear(self) -> None:
        raise KvCacheError("LatentSlotCache.clear: a batch slot's storage belongs to its BatchLatentCache; "
                           "release the slot and acquire another instead")

    def set_slot(self, layer, slot, tensor) -> None:
        raise KvCacheError("LatentSlotCache.set_slot: a batch slot's storage belongs to its BatchLatentCache")

    def check_room(self, start: int, n: int) -> None:
        if self.released:
            raise KvCacheError(f"LatentSlotCache: slot {self.slot} was released; acquire a new one")
        super().check_room(start, n)


class PagedBatch(PoolFacing):
    """Up to ``max_rows`` sequences of one block pool, decoded together (the ragged paged batch).

    Every sequence has the same block-table capacity (``max_blocks_cap``), so a bucket's
    padded table ``[B, max_blocks_cap]`` has one shape; how many blocks each row really owns
    is per-token data. A padding row's table is all null blocks and it writes null block slot 0.
    """

    kv_layout = "paged"
    batched = True

    def __init__(self, pool: KvBlockPool, max_rows: int, max_blocks_cap: int) -> None:
        if not isinstance(pool, KvBlockPool):
            raise KvCacheError(f"PagedBatch needs a KvBlockPool, got {type(pool).__name__}")
        self.pool = pool
        self._max_rows = check_size("PagedBatch", "max_rows", max_rows)
        self.max_blocks_cap = check_size("PagedBatch", "max_blocks_cap", max_blocks_cap)
        self.held: list[PagedSequence] = []

    # ---- the protocol the batch decoder and held plans read (the pool's part: PoolFacing) --
    @property
    def max_rows(self) -> int:
        return self._max_rows

    @property
    def free_rows(self) -> int:
        return self._max_rows - len(self.held)

    def plan_geometry(self, bucket: int, seq: int) -> tuple:
        return (("bucket", bucket), ("seq", seq), ("max_blocks_cap", self.max_blocks_cap),
                ("block_size", self.pool.block_size))

    def acquire(self) -> PagedSequence:
        if not self.free_rows:
            raise KvOutOfSlotsError(f"PagedBatch: all {self._max_rows} rows are held; release one first")
        seq = self.pool.sequence(self.max_blocks_cap)
        seq.batch, seq.released = self, False
        self.held.append(seq)
        return seq

    def owns(self, handle) -> bool:
        return any(h is handle for h in self.held)

    def release(self, handle: PagedSequence) -> None:
        """Free the sequence's blocks to the pool at once and give its row back."""
        if not self.owns(handle):
            raise KvCacheError("PagedBatch.release: the sequence is not held by this batch (already released?)")
        self.held = [h for h in self.held if h is not handle]
        handle.free()
        handle.released = True

    def row_indices(self, rows: Sequence, positions: torch.Tensor) -> dict:
        """Flattened write offsets [B] and the stacked block tables [B, max_blocks_cap]."""
        bs = self.pool.block_size
        table = torch.full((len(rows), self.max_blocks_cap), NULL_BLOCK, dtype=torch.int64)
        write = []
        for i, row in enumerate(rows):
            if row is None:
                write.append(NULL_BLOCK * bs)
                continue
            table[i] = row.block_table()[0]
            p = int(positions[i])
            write.append(row.blocks[p // bs] * bs + p % bs)
        return {"block_table": table, "write_index": torch.tensor(write, dtype=torch.int64)}

    def slot_of_row(self, handle) -> torch.Tensor:
        return handle.block_table()[0].clone()

    # ---- room beyond a free row: the pool's blocks ---------------------------------------------
    def _blocks(self, positions: int) -> int:
        return -(-positions // self.pool.block_size)

    def never_holds(self, positions: int) -> Optional[str]:
        usable = self.pool.num_blocks - 1
        need = self._blocks(positions)
        return None if need <= usable else f"which needs {need} blocks; the pool has {usable} in all"

    def holds_now(self, positions: int) -> bool:
        return self._blocks(positions) <= self.pool.free_blocks

    def free_room(self) -> str:
        return f"free rows {self.free_rows}, free blocks {self.pool.free_blocks}"

    def check_packed_room(self, rows: Sequence, lengths: Sequence[int]) -> None:
        need = sum(max(0, self._blocks(n) - len(r.blocks)) for r, n in zip(rows, lengths))
        if need > self.pool.free_blocks:
            raise KvOutOfBlocksError(f"packed prefill: the prompts need {need} more blocks, the pool has "
                                     f"{self.pool.free_blocks} free; nothing was allocated")

    def packed_writes(self, rows: Sequence, lengths: Sequence[int]) -> dict[str, torch.Tensor]:
        """Where each token of a packed prefill writes: its offset in the pool ([N])."""
        return {"write_index": torch.cat([r.write_index(0, n) for r, n in zip(rows, lengths)])}

    def write_unit(self, row: PagedSequence, tensor_index: int) -> tuple[int, int]:
        """(block, offset) ``row``'s next step writes."""
        bs, p = self.pool.block_size, row.cached_len
        return row.blocks[p // bs], p % bs

    def poison_unwritten(self, live: Sequence, value: float = float("nan")) -> None:
        """``value`` into every free block and every offset past a live row's length."""
        free, bs = self.pool.free_block_ids(), self.pool.block_size
        for t in self.bound_tensors():
            if free:
                t[torch.tensor(free)] = value
            for row in live:
                for i, block in enumerate(row.blocks):
                    start = max(0, row.cached_len - i * bs)
                    if start < bs:
                        t[block, start:] = value

    def bytes_per_slot(self) -> int:
        """Bytes a sequence holds at full capacity (it owns only the blocks it has grown into)."""
        return self.max_blocks_cap * self.pool.block_size * self.pool.bytes_per_token()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bound_tensors())


class BucketView:
    """A batch cache as one bucket's held plan sees it: the bucket is part of the plan's geometry.

    ``extra_geometry`` holds a plan policy's extra key fields (``PlanPolicy.bucket_key``); the
    default policy adds none.
    """

    def __init__(self, kv, bucket: int, extra_geometry: tuple = ()) -> None:
        self.kv, self.bucket, self._extra = kv, bucket, extra_geometry
        self.kv_layout, self.batched = kv.kv_layout, kv.batched

    n_layers = property(lambda self: self.kv.n_layers)
    dtype = property(lambda self: self.kv.dtype)
    alloc_id = property(lambda self: self.kv.alloc_id)
    device_location = property(lambda self: self.kv.device_location)

    def plan_geometry(self, seq: int) -> tuple:
        return self.kv.plan_geometry(self.bucket, seq) + self._extra

    def bound_tensors(self) -> list[torch.Tensor]:
        return self.kv.bound_tensors()

    def rebind_location(self):
        return self.kv.rebind_location()

    def rebind_slot(self, layer: int, which: int):
        return self.kv.rebind_slot(layer, which)
