"""generate reserves its whole need before the prefill: a request fits up front or changes nothing."""
import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.errors import KvCapacityError
from fuelpipe.kv.paged import KvOutOfBlocksError
from models.registry import build_random_model

BS = 4
PROMPT = [3, 17, 42, 7, 99]


@pytest.fixture(scope="module")
def model():
    return build_random_model("llama", "tiny", seed=1)


def test_a_pool_too_small_for_the_whole_request_is_refused_up_front_changing_nothing(model):
    ctx = InferenceContext(model, "eager")
    pool = ctx.new_pool(num_blocks=4, block_size=BS)  # 3 usable blocks = 12 positions
    seq = pool.sequence(max_blocks_cap=8)  # the table could name 32 positions: only the pool is short
    free_before = pool.free_block_ids()
    with pytest.raises(KvOutOfBlocksError, match="need 4 free blocks, only 3 of 3 usable are free"):
        ctx.generate(PROMPT, 10, cache=seq)  # writes 5 + 10 - 1 = 14 positions: 4 blocks
    assert pool.free_block_ids() == free_before
    assert (seq.blocks, seq.cached_len) == ([], 0)
    assert torch.equal(seq.block_table(), torch.zeros(1, 8, dtype=torch.int64))
    assert ctx.plan.stats.builds == 0  # nothing ran


def test_a_pool_with_enough_blocks_completes_and_matches_a_contiguous_run(model):
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=5, block_size=BS)  # 4 usable = 16 positions
    seq = pool.sequence(max_blocks_cap=8)
    got = ctx.generate(PROMPT, 12, cache=seq)  # 16 positions exactly
    want = InferenceContext(model, "fx").generate(PROMPT, 12)
    assert got.tokens == want.tokens and len(got.tokens) == 12
    assert pool.free_blocks == 0 and seq.cached_len == 16


def test_reserved_blocks_cannot_be_taken_by_another_sequence_mid_run(model):
    ctx = InferenceContext(model, "eager")
    pool = ctx.new_pool(num_blocks=5, block_size=BS)  # 4 usable
    a, b = pool.sequence(max_blocks_cap=4), pool.sequence(max_blocks_cap=4)
    refused = []

    def intruder(token: int) -> None:  # another request on the same pool, while a is mid-generation
        if not refused and b.cached_len == 0:
            try:
                ctx.prefill(b, [1] * 8)  # wants 2 blocks
            except KvOutOfBlocksError as err:
                refused.append(err)

    result = ctx.generate(PROMPT, 8, cache=a, on_token=intruder)  # 12 positions: 3 blocks, all owned up front
    assert len(result.tokens) == 8 and a.cached_len == 12
    assert len(refused) == 1 and "need 2 free blocks, only 1" in str(refused[0])
    assert b.blocks == [] and b.cached_len == 0 and pool.free_blocks == 1


def test_generate_continues_a_filled_sequence_reserving_from_its_length(model):
    ctx = InferenceContext(model, "eager")
    pool = ctx.new_pool(num_blocks=4, block_size=BS)
    seq = pool.sequence(max_blocks_cap=4)  # 16 positions in the table, 3 blocks in the pool
    ctx.prefill(seq, [1, 2, 3, 4, 5, 6])  # 2 blocks
    with pytest.raises(KvOutOfBlocksError):
        ctx.generate([7, 8], 6, cache=seq)  # positions [6, 13): a 4th block the pool does not have
    assert seq.cached_len == 6 and len(seq.blocks) == 2 and pool.free_blocks == 1
    assert len(ctx.generate([7, 8], 5, cache=seq).tokens) == 5  # [6, 12): fits the 3 blocks


def test_contiguous_and_latent_reserve_is_a_capacity_check():
    llama = build_random_model("llama", "tiny", seed=1)
    cache = InferenceContext(llama).new_cache(8)
    cache.reserve(8)
    with pytest.raises(KvCapacityError, match=r"positions \[0, 9\) exceed max_seq_len 8"):
        cache.reserve(9)
    latent = InferenceContext(build_random_model("deepseek_v2", "tiny", seed=1)).new_cache(8)
    latent.reserve(8)
    with pytest.raises(KvCapacityError, match=r"positions \[0, 9\) exceed max_seq_len 8"):
        latent.reserve(9)
