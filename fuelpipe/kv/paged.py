"""Paged KV: a device block pool shared by many sequences, and per-sequence block tables.

Pool layout per layer and slot: [num_blocks, block_size, n_kv_heads, head_dim]
(position-major inside a block). Block 0 is the null block: never handed out,
kept zero, and the target of every padded block-table entry, so padding points
nowhere a live sequence wrote. The pool's ``alloc_id`` names the buffers; a
sequence growing into new blocks does not change it (which blocks a sequence
owns rides the per-token block-table rebind).
"""
from __future__ import annotations

from typing import Optional

import torch

from fuelpipe.errors import KvCacheError, KvCapacityError, KvLayerError
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.allocation import Allocation
from fuelpipe.kv.sizes import check_dtype, check_size

NULL_BLOCK = 0


class KvOutOfBlocksError(KvCapacityError):
    """The pool has too few free blocks; nothing was allocated or written."""


class KvBlockPool(Allocation):
    def __init__(self, n_layers, n_kv_heads, head_dim, num_blocks, block_size, dtype=torch.float32, device="cpu"):
        n_layers, n_kv_heads, head_dim, block_size = (
            check_size("KvBlockPool", name, v) for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                                                                ("head_dim", head_dim), ("block_size", block_size)))
        num_blocks = check_size("KvBlockPool", "num_blocks", num_blocks, 2, " (block 0 is the null block)")
        dtype = check_dtype("KvBlockPool", dtype)
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        dev = torch.device(device)
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(n_layers)]  # [NB, bs, Hkv, D]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(n_layers)]
        self._alloc_id = KvAllocId.mint()
        self._device_location: Optional[torch.device] = self.k[0].device
        self._free = list(range(num_blocks - 1, NULL_BLOCK, -1))  # pop() hands out low ids first

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise KvOutOfBlocksError(
                f"KvBlockPool: need {n} free blocks, only {len(self._free)} of {self.num_blocks - 1} usable are free"
            )
        return [self._free.pop() for _ in range(n)]

    def scramble_free_list(self, seed: int) -> None:
        """Permute which physical blocks are handed out next (placement-independence tests, fragmentation)."""
        import random

        random.Random(seed).shuffle(self._free)

    def free_block_ids(self) -> list[int]:
        return sorted(self._free)

    def take(self, blocks: list[int]) -> None:
        """Allocate these exact physical blocks (tests use it to permute placement)."""
        missing = [b for b in blocks if b not in self._free]
        if missing:
            raise KvOutOfBlocksError(f"KvBlockPool: blocks {missing} are not free")
        for b in blocks:
            self._free.remove(b)

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            if b == NULL_BLOCK or b in self._free or not 0 < b < self.num_blocks:
                raise KvLayerError(f"KvBlockPool: cannot free block {b} (null, already free or out of range)")
        self._free.extend(reversed(blocks))

    def sequence(self, max_blocks_cap: int) -> "PagedSequence":
        return PagedSequence(self, max_blocks_cap)

    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


class PoolFacing:
    """What anything decoding from one ``KvBlockPool`` shows a plan: the pool's geometry, identity,
    residency and buffers (a sequence's blocks and table are per-token data, not part of these)."""

    pool: KvBlockPool
    max_blocks_cap: int

    @property
    def n_layers(self) -> int:
        return self.pool.n_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    @property
    def alloc_id(self) -> KvAllocId:
        return self.pool.alloc_id

    @property
    def device_location(self):
        return self.pool.device_location

    @property
    def width(self) -> int:
        """Attention width: every position a padded block table can name."""
        return self.max_blocks_cap * self.pool.block_size

    @property
    def max_seq_len(self) -> int:
        return self.width

    # ---- rebind source --------------------------------------------------------------------
    def rebind_location(self):
        return self.pool.device_location

    def rebind_slot(self, layer: int, which: int):
        if not 0 <= layer < self.pool.n_layers or which not in (0, 1):
            return None
        return (self.pool.k, self.pool.v)[which][layer]

    def bound_tensors(self) -> list[torch.Tensor]:
        out = []
        for i in range(self.pool.n_layers):
            out += [self.pool.k[i], self.pool.v[i]]
        return out


class PagedSequence(PoolFacing):
    """One request's view of the pool: its block table, length and the plan-facing cache protocol."""

    kv_layout = "paged"  # fuelpipe.kv.paged_layout
    batched = False

    def __init__(self, pool: KvBlockPool, max_blocks_cap: int) -> None:
        max_blocks_cap = check_size("PagedSequence", "max_blocks_cap", max_blocks_cap)
        self.pool = pool
        self.max_blocks_cap = max_blocks_cap
        self.blocks: list[int] = []
        self.cached_len = 0
        self._table = torch.full((1, max_blocks_cap), NULL_BLOCK, dtype=torch.int64)  # [1, cap]

    # ---- geometry (what the plan key reads) -------------------------------------------------
    def plan_geometry(self, seq: int) -> tuple:
        return (("seq", seq), ("max_blocks_cap", self.max_blocks_cap), ("block_size", self.pool.block_size))

    # ---- growth ---------------------------------------------------------------------------
    def check_room(self, start: int, n: int) -> None:
        """Make positions [start, start+n) writable, allocating blocks atomically, or raise (nothing changes)."""
        if getattr(self, "released", False):  # a batch row handed back (PagedBatch.release): its blocks are gone
            raise KvCacheError("PagedSequence: this batch row was released; acquire a new one")
        end = start + n
        if start < 0 or end > self.width:
            raise KvCapacityError(
                f"PagedSequence: positions [{start}, {end}) exceed max_blocks_cap {self.max_blocks_cap} x "
                f"block_size {self.pool.block_size} = {self.width}"
            )
        need = -(-end // self.pool.block_size) - len(self.blocks)
        if need > 0:
            new = self.pool.allocate(need)
            for b in new:
                self._table[0, len(self.blocks)] = b
                self.blocks.append(b)

    def reserve(self, end: int) -> None:
        """Own every block positions [0, end) will need, now: all of them or, raising, none.

        ``generate`` reserves its whole need before the prefill, so a request either fits the pool
        up front or is refused with the sequence and the pool untouched (``KvCapacityError`` past
        the block table, ``KvOutOfBlocksError`` when the pool is short), and no other sequence
        sharing the pool can take those blocks mid-run. Reserved blocks stay with the sequence
        until ``free``.
        """
        self.check_room(0, end)

    def write_index(self, start: int, n: int) -> torch.Tensor:
        """Flattened write offsets physical_block * block_size + slot, [n] int64."""
        bs = self.pool.block_size
        pos = range(start, start + n)
        return torch.tensor([self.blocks[p // bs] * bs + p % bs for p in pos], dtype=torch.int64)

    def block_table(self) -> torch.Tensor:
        return self._table

    def advance(self, n: int) -> None:
        self.check_room(self.cached_len, n)
        self.cached_len += n

    def truncate_to(self, new_len: int) -> None:
        """Rewind to ``new_len`` positions (speculative rollback); the pool's alloc_id is kept.

        Only rewinds: a ``new_len`` past ``cached_len`` is refused (``KvCapacityError``) and
        nothing changes. Blocks wholly past ``new_len`` stay owned by this sequence and stay in
        its block table: a rollback re-grows into them without allocating (so it cannot run out
        of blocks half-way), their stale contents are masked until overwritten, and ``free()``
        returns them to the pool.
        """
        if isinstance(new_len, bool) or not isinstance(new_len, int):
            raise KvCacheError(f"truncate_to: new_len must be an int, got {type(new_len).__name__} {new_len!r}")
        if new_len < 0:
            raise KvCapacityError(f"truncate_to: new_len must be >= 0, got {new_len}")
        if new_len > self.cached_len:
            raise KvCapacityError(
                f"truncate_to: new_len must be <= cached_len {self.cached_len} (truncate only rewinds), got {new_len}"
            )
        self.cached_len = new_len

    def free(self) -> None:
        """Return every block to the pool; the sequence is empty afterwards."""
        self.pool.release(self.blocks)
        self.blocks = []
        self._table.fill_(NULL_BLOCK)
        self.cached_len = 0

    def reset(self) -> None:
        """Empty for a new conversation: ``free()`` (the pool, and a plan on it, are kept)."""
        self.free()

    def recycle(self) -> "PagedSequence":
        """Done with this request: its blocks go back, and a new sequence on the same pool serves the next."""
        self.free()
        return self.pool.sequence(self.max_blocks_cap)

    def bump_all_versions(self) -> None:  # the pool tracks no per-slot versions
        pass

    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_token()

    def nbytes(self) -> int:
        """Bytes of the blocks this sequence owns (the pool itself may be larger and shared)."""
        return len(self.blocks) * self.pool.block_size * self.pool.bytes_per_token()
