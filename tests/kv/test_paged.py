"""Paged KV: parity with contiguous, shared pools, write sets, poison, plan reuse, typed refusals."""
import pytest
import torch

from conftest import decode_logits
from fuelpipe.context import InferenceContext
from fuelpipe.driver import live_key
from fuelpipe.errors import KvCapacityError
from fuelpipe.kv.paged import NULL_BLOCK, KvBlockPool, KvOutOfBlocksError
from fuelpipe.plan.validity import PlanValidity
from models.registry import build_random_model, families

BS = 4
PROMPT = [3, 17, 42, 7, 99]
FAMILIES = sorted(n for n, e in families().items() if not e.is_mla)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return build_random_model(request.param, "tiny", seed=5)


def contiguous_run(model, steps, backend="fx", prompt=PROMPT):
    ctx = InferenceContext(model, backend)
    return decode_logits(ctx, ctx.new_cache(64), prompt, steps)


@pytest.mark.parametrize("end", [3 * BS - 1, 3 * BS, 3 * BS + 1])
def test_paged_equals_contiguous_across_block_boundaries(model, end):
    steps = end - len(PROMPT)
    want = contiguous_run(model, steps)
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=12, block_size=BS)
    seq = pool.sequence(max_blocks_cap=16)  # width 64, as the contiguous cache
    got = decode_logits(ctx, seq, PROMPT, steps)
    assert seq.cached_len == end and len(seq.blocks) == -(-end // BS)
    err = max((a - b).abs().max().item() for a, b in zip(got, want))
    assert err <= 1e-5, f"max abs error {err}"
    assert ctx.plan.stats.builds == 1 and ctx.plan.session.realize_count == steps - 1


def test_three_sequences_share_a_permuted_pool_and_equal_their_solo_runs(model):
    prompts = [PROMPT, [9, 8, 7], [200, 100, 50, 25, 12, 6]]
    steps = 10
    solo = [contiguous_run(model, steps, prompt=p) for p in prompts]
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=24, block_size=BS)
    pool.scramble_free_list(seed=3)
    seqs = [pool.sequence(max_blocks_cap=8) for _ in prompts]
    rows = [[ctx.prefill(s, p)[0]] for s, p in zip(seqs, prompts)]
    for _ in range(steps):
        for s, r in zip(seqs, rows):  # interleaved token by token
            r.append(ctx.decode(s, int(r[-1].argmax()))[0])
    for r, want in zip(rows, solo):
        assert max((a - b).abs().max().item() for a, b in zip(r, want)) <= 1e-5
    owned = [b for s in seqs for b in s.blocks]
    assert len(owned) == len(set(owned)) and NULL_BLOCK not in owned
    assert any(b1 > b2 for s in seqs for b1, b2 in zip(s.blocks, s.blocks[1:])), "blocks were not permuted"
    assert ctx.plan.stats.builds == 1  # one pool: the plan is never rebuilt, block tables ride the rebind


def test_write_set_and_poison(model):
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=10, block_size=BS)
    seq = pool.sequence(max_blocks_cap=6)
    clean_ctx = InferenceContext(model, "fx")
    clean = decode_logits(clean_ctx, clean_ctx.new_pool(10, BS).sequence(6), PROMPT, 12)
    poison = 1.0e4
    logits = ctx.prefill(seq, PROMPT)
    # Poison everything no live position owns: free blocks, the null block, the unwritten tail of owned blocks.
    owned = set(seq.blocks)
    for t in pool.k + pool.v:
        for b in range(pool.num_blocks):
            if b not in owned:
                t[b].fill_(poison)
        if seq.cached_len % BS:
            t[seq.blocks[-1], seq.cached_len % BS :].fill_(poison)
    rows = [logits[0]]
    for step in range(12):
        before = [t.clone() for t in pool.k + pool.v]
        pos = seq.cached_len
        rows.append(ctx.decode(seq, int(rows[-1].argmax()))[0])
        phys, slot = seq.blocks[pos // BS], pos % BS
        for old, new in zip(before, pool.k + pool.v):
            changed = (old != new).any(dim=-1).any(dim=-1).nonzero().tolist()  # [block, slot] pairs
            assert changed == [[phys, slot]], f"step {step}: wrote {changed}, table names {(phys, slot)}"
        for t in pool.k + pool.v:  # blocks grown into later start poisoned too
            for b in range(pool.num_blocks):
                if b not in seq.blocks:
                    assert torch.all(t[b] == poison)
    assert all(torch.equal(a, b) for a, b in zip(rows, clean)), "poisoned free/padded blocks changed logits"


def test_crossing_blocks_keeps_the_plan_and_another_pool_is_not_reused_as_is(model):
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=8, block_size=BS)
    seq = pool.sequence(max_blocks_cap=6)
    decode_logits(ctx, seq, PROMPT, 3 * BS)  # crosses three block boundaries
    assert ctx.plan.stats.builds == 1 and ctx.plan.session.realize_count == 3 * BS - 1
    other = ctx.new_pool(num_blocks=8, block_size=BS).sequence(max_blocks_cap=6)
    assert ctx.plan.session.validity_for(live_key(model, other, 1)) is PlanValidity.ALLOCATION_CHANGED
    got = decode_logits(ctx, other, PROMPT, 4)
    assert ctx.plan.stats.rebinds == 1 and ctx.plan.session.bound_kv()[0] is other.pool.k[0]
    want = contiguous_run(model, 4)
    assert max((a - b).abs().max().item() for a, b in zip(got, want)) <= 1e-5
    bigger_cap = pool.sequence(max_blocks_cap=7)  # different table shape: structural, rebuild
    assert ctx.plan.session.validity_for(live_key(model, bigger_cap, 1)) is PlanValidity.STALE


def test_out_of_blocks_and_over_capacity_are_typed_and_change_nothing():
    model = build_random_model("llama", "tiny", seed=1)
    ctx = InferenceContext(model, "fx")
    pool = ctx.new_pool(num_blocks=4, block_size=BS)  # 3 usable blocks
    a = pool.sequence(max_blocks_cap=2)
    ctx.prefill(a, [1, 2, 3, 4, 5])  # 2 blocks
    b = pool.sequence(max_blocks_cap=4)
    free_before = pool.free_block_ids()
    with pytest.raises(KvOutOfBlocksError, match="need 2 free blocks, only 1 of 3 usable are free"):
        ctx.prefill(b, [1] * 6)
    assert pool.free_block_ids() == free_before and b.blocks == [] and b.cached_len == 0
    ctx.prefill(a, [6, 7, 8])  # fills a's 2 blocks exactly
    snapshot = [t.clone() for t in pool.k + pool.v]
    with pytest.raises(KvCapacityError, match=r"positions \[8, 9\) exceed max_blocks_cap 2 x block_size 4 = 8"):
        ctx.decode(a, 1)
    assert a.cached_len == 8 and pool.free_block_ids() == free_before
    assert all(torch.equal(x, y) for x, y in zip(snapshot, pool.k + pool.v))
    a.free()
    assert len(pool.free_block_ids()) == 3 and a.blocks == []
    with pytest.raises(KvCapacityError, match="num_blocks must be >= 2"):
        KvBlockPool(1, 1, 4, 1, 4)


def test_paged_plan_once_equals_replan_bit_exact():
    model = build_random_model("llama", "tiny", seed=1)
    runs = []
    for plan in ("plan_once", "replan"):
        ctx = InferenceContext(model, "fx", plan)
        runs.append(decode_logits(ctx, ctx.new_pool(12, BS).sequence(8), PROMPT, 14))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
