"""What a request needs beyond a free row (the room protocol the scheduler and packed prefill read), and
what each one-sequence cache hands the next request (``recycle``)."""
from __future__ import annotations

import pytest
import torch

from fuelpipe.errors import KvCacheError
from fuelpipe.kv.batch import BatchKvCache, PagedBatch
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.latent import LatentKvCache
from fuelpipe.kv.paged import KvBlockPool, KvOutOfBlocksError
from fuelpipe.kv.ring import RingKvCache


def _paged(num_blocks=6, block_size=4, rows=3, cap=8):
    return PagedBatch(KvBlockPool(1, 1, 2, num_blocks, block_size), rows, cap)


def test_slot_rows_need_nothing_beyond_a_free_row():
    kv = BatchKvCache(1, 1, 2, n_slots=2, max_seq_len=16)
    assert kv.never_holds(16) is None and kv.holds_now(16)
    assert kv.free_room() == "free rows 2"
    a, b = kv.acquire(), kv.acquire()
    kv.check_packed_room([a, b], [16, 16])  # a row's width is the scheduler's check, not the room's
    writes = kv.packed_writes([a, b], [2, 3])
    assert writes["write_index"].tolist() == [0, 1, 0, 1, 2]  # [N] positions per prompt
    assert writes["slot_ids"].tolist() == [a.slot] * 2 + [b.slot] * 3  # [N] each token's slot


def test_a_paged_batch_answers_with_its_pool_blocks():
    kv = _paged(num_blocks=6, block_size=4)  # 5 usable blocks: block 0 is the null block
    assert kv.never_holds(20) is None
    assert kv.never_holds(21) == "which needs 6 blocks; the pool has 5 in all"
    seq = kv.acquire()
    seq.advance(12)  # 3 blocks held
    assert kv.holds_now(8) and not kv.holds_now(9)
    assert kv.free_room() == "free rows 2, free blocks 2"


def test_packed_room_is_checked_before_any_block_is_taken():
    kv = _paged(num_blocks=6, block_size=4)
    a, b = kv.acquire(), kv.acquire()
    free = kv.pool.free_blocks
    with pytest.raises(KvOutOfBlocksError, match="need 6 more blocks, the pool has 5 free; nothing was allocated"):
        kv.check_packed_room([a, b], [12, 12])
    assert kv.pool.free_blocks == free and a.blocks == [] and b.blocks == []
    kv.check_packed_room([a, b], [8, 4])  # 3 blocks: fits
    a.check_room(0, 5)
    b.check_room(0, 3)
    writes = kv.packed_writes([a, b], [5, 3])["write_index"]  # [N] flattened pool offsets
    bs = kv.pool.block_size
    assert writes.tolist() == [a.blocks[p // bs] * bs + p % bs for p in range(5)] + \
                              [b.blocks[0] * bs + p for p in range(3)]


def _caches():
    return {
        "contiguous": ContiguousKvCache(1, 1, 2, 8, torch.float32, "cpu"),
        "latent": LatentKvCache(1, ((4,),), 8),
        "ring": RingKvCache(1, 2, (4, None), 8, torch.float32, "cpu"),
    }


@pytest.mark.parametrize("name", ["contiguous", "latent", "ring"])
def test_an_up_front_cache_recycles_itself_on_fresh_storage(name):
    cache = _caches()[name]
    cache.advance(3)
    old = cache.alloc_id
    again = cache.recycle()
    assert again is cache and cache.cached_len == 0 and cache.alloc_id != old  # a new allocation: one rebind


def test_a_paged_sequence_hands_the_next_request_a_new_sequence_on_the_same_pool():
    pool = KvBlockPool(1, 1, 2, num_blocks=8, block_size=2)
    seq = pool.sequence(4)
    seq.advance(3)
    nxt = seq.recycle()
    assert nxt is not seq and nxt.pool is pool and nxt.alloc_id == seq.alloc_id == pool.alloc_id
    assert seq.blocks == [] and pool.free_blocks == 7  # every block back; the successor holds none yet
    seq2 = pool.sequence(4)
    seq2.advance(2)
    seq2.reset()  # reset() is free(): empty, the pool (and a plan on it) kept
    assert seq2.cached_len == 0 and seq2.blocks == [] and pool.free_blocks == 7


def test_a_batch_slot_handle_refuses_to_recycle_typed():
    kv = BatchKvCache(1, 1, 2, n_slots=2, max_seq_len=8)
    handle = kv.acquire()
    with pytest.raises(KvCacheError):
        handle.recycle()  # its storage is the batch's: release() it instead
