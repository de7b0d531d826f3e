"""cache_lifecycle: truncate/rollback, reset and reuse, a RoPE change, clear; and truncate_to's refusals."""
from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, default_or_slow
from fuelpipe import context
from fuelpipe.context import InferenceContext
from fuelpipe.errors import KvCacheError, KvCapacityError
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.paged import NULL_BLOCK, KvBlockPool
from fuelpipe.oracles.paged_invariants import audit, pool_problems, sequence_problems
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from models.registry import build_random_model, families
from _support.planted_batch import BUGS

NAME = "cache_lifecycle"
CASES = [(f, kv) for f, e in sorted(families().items()) for kv in (("latent",) if e.is_mla else ("contiguous", "paged"))]


def _run(compose_cfg, family, kv, *extra):
    overrides = [f"model={family}_tiny", f"kv={kv}", "experiment.new_tokens=4", *extra]
    if kv == "paged":
        overrides.append("kv.block_size=4")  # rollback and reset cross block boundaries
    cfg = compose_cfg(overrides)
    return run_one(cfg, assemble(cfg), ORACLES[NAME])


@pytest.mark.parametrize("family, kv", default_or_slow(
    CASES, [("llama", "contiguous"), ("qwen3", "paged"), ("deepseek_v2", "latent")], [f"{f}-{kv}" for f, kv in CASES]))
def test_passes_on_fx_and_catches_a_stale_rope(compose_cfg, family, kv):
    healthy = _run(compose_cfg, family, kv, "backend=fx")
    assert healthy.passed, healthy.detail
    paths = 1 if kv == "latent" else 2
    per_path = 12 if kv == "paged" else 11  # a paged cache adds its block table / pool audit
    assert healthy.metric["checks"] == per_path * paths and healthy.metric["max_abs_error"] == 0.0
    ran = healthy.detail.split("step path(s) ", 1)[1].split(";")[0].split(", ")
    assert sorted(ran) == {"contiguous": ["symbol", "tensor"], "paged": ["paged", "paged_symbol"],
                           "latent": ["latent"]}[kv]  # both offset paths, where the layout has two

    control = _run(compose_cfg, family, kv, "backend=fx", f"experiment.oracles.{NAME}.inject_fault=true")
    assert not control.passed and control.fault == "stale_rope"
    failed = control.detail.split("failed: ", 1)[1]
    assert "RoPE change" in failed and "truncate" not in failed, failed  # only the RoPE scenario sees it
    assert control.metric["failed_checks"] == paths


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_passes_on_eager_and_replan(compose_cfg, kv):
    eager = _run(compose_cfg, "llama", kv, "backend=eager")
    assert eager.passed, eager.detail
    replan = _run(compose_cfg, "llama", kv, "backend=eager", "plan=replan")
    assert replan.passed, replan.detail  # accounting: one build per decode token, never a rebind


def test_a_reset_that_does_not_rewind_is_caught(compose_cfg, monkeypatch):
    """A planted bug outside the negative control: reset() zeroes the buffers but keeps cached_len."""
    def reset_keeping_length(self):
        for layer in self.layers:
            layer.k.zero_()
            layer.v.zero_()

    monkeypatch.setattr(ContiguousKvCache, "reset", reset_keeping_length)
    result = _run(compose_cfg, "llama", "contiguous", "backend=fx")
    assert not result.passed and "reset() and reuse for another prompt" in result.detail


def test_a_mask_that_lets_the_stale_tail_through_is_caught(compose_cfg, monkeypatch):
    """A planted bug: the decode mask hides nothing past the live length. A fresh cache holds zeros there,
    so the first pass of both arms is equally wrong and equal; only a rolled-back cache, whose stale tail
    holds real keys, can show it (on the tensor path: the symbol path never reads past the live length)."""
    real = context.compute_token_host

    def unmasked(*args, **kwargs):
        host = real(*args, **kwargs)
        if host.seq == 1:
            host.mask = torch.zeros_like(host.mask)
        return host

    monkeypatch.setattr(context, "compute_token_host", unmasked)
    result = _run(compose_cfg, "llama", "contiguous", "backend=fx")
    assert not result.passed
    failed = result.detail.split("failed: ", 1)[1]
    assert "[tensor] truncate_to" in failed and "first pass equals" not in failed and "[symbol]" not in failed, failed


def test_a_recycle_that_keeps_the_allocation_is_caught(compose_cfg, monkeypatch):
    """recycle() hands back the same cache but keeps its storage and id (a reset, not a new allocation):
    every logit stays right, so only the allocation check and the rebind accounting can see it."""
    from fuelpipe.kv.contiguous import ContiguousKvCache

    monkeypatch.setattr(ContiguousKvCache, "recycle", lambda self: (self.reset(), self)[1])
    result = _run(compose_cfg, "llama", "contiguous", "backend=fx")
    assert not result.passed
    failed = result.detail.split("failed: ", 1)[1]
    assert "recycle() gives a new allocation exactly when it hands back the same cache" in failed, failed
    assert "plan accounting after recycle()" in failed, failed


def test_a_free_that_leaves_stale_block_ids_is_caught(compose_cfg, monkeypatch):
    """free() returns the blocks but keeps their ids in the table: masked, so every logit stays right;
    only the structure audit sees it, after reset() and after recycle(), on both offset paths."""
    BUGS["free_leaves_stale_block_ids"][0](monkeypatch)
    result = _run(compose_cfg, "llama", "paged", "backend=fx")
    assert not result.passed and result.metric["failed_checks"] == 2, result.detail
    failed = result.detail.split("failed: ", 1)[1]
    assert "block table and pool partition after every operation" in failed and "after reset()" in failed, failed


# ---- the paged structure audit on hand-built pools --------------------------------------------
def _pool_with_two_sequences():
    pool = KvBlockPool(1, 1, 2, num_blocks=8, block_size=2)
    a, b = pool.sequence(4), pool.sequence(4)
    a.advance(3)  # 2 blocks
    b.advance(1)  # 1 block
    return pool, a, b


def test_the_structure_audit_passes_a_healthy_pool_through_truncate_and_free():
    pool, a, b = _pool_with_two_sequences()
    assert audit([a, b], [], pool, "grown") == []
    a.truncate_to(1)
    assert audit([a, b], [], pool, "truncated") == []  # truncated blocks stay owned and in the table
    a.free()
    assert audit([b], [a], pool, "freed") == []


def test_the_structure_audit_names_stale_ids_double_owners_and_leaks():
    pool, a, b = _pool_with_two_sequences()
    a.block_table()[0, 3] = a.blocks[0]  # an id past the owned blocks
    assert "past its 2 owned blocks" in " ".join(sequence_problems(a, "a"))
    a.block_table()[0, 3] = NULL_BLOCK
    b.blocks.append(a.blocks[1])  # owned twice (and not in b's table)
    problems = " ".join(audit([a, b], [], pool, "shared"))
    assert "both free and owned, or owned twice" in problems and "block table starts" in problems
    b.blocks.pop()
    pool.allocate(1)  # taken from the free list, owned by nobody
    assert "neither free nor owned (leaked)" in " ".join(pool_problems(pool, [a, b], "leak"))
    b.cached_len = 5  # more positions than its one block holds
    assert "needs 3" in " ".join(sequence_problems(b, "b"))


# ---- truncate_to refuses to go past the cached length, on every cache kind ------------------
def _cache(kind: str):
    model = build_random_model("deepseek_v2" if kind == "latent" else "llama", "tiny", seed=3)
    ctx = InferenceContext(model, "eager")
    cache = ctx.new_pool(num_blocks=8, block_size=2).sequence(6) if kind == "paged" else ctx.new_cache(12)
    ctx.prefill(cache, PROMPT)  # 5 positions: three paged blocks
    return ctx, cache


def _state(cache):
    table = cache.block_table()
    return cache.cached_len, cache.alloc_id, cache.nbytes(), None if table is None else table.clone()


@pytest.mark.parametrize("kind", ["contiguous", "paged", "latent"])
def test_truncate_past_the_length_is_refused_and_changes_nothing(kind):
    ctx, cache = _cache(kind)
    before = _state(cache)
    for bad in (len(PROMPT) + 1, 12, 10**6):
        with pytest.raises(KvCapacityError, match=rf"new_len must be <= cached_len 5 \(truncate only rewinds\), "
                                                  rf"got {bad}"):
            cache.truncate_to(bad)
    with pytest.raises(KvCapacityError, match="new_len must be >= 0, got -1"):
        cache.truncate_to(-1)
    with pytest.raises(KvCacheError, match="new_len must be an int, got float 2.0"):
        cache.truncate_to(2.0)
    after = _state(cache)
    assert after[:3] == before[:3] and (before[3] is None or torch.equal(after[3], before[3]))
    cache.truncate_to(len(PROMPT))  # to the length itself: allowed, a no-op
    cache.truncate_to(2)
    assert cache.cached_len == 2 and cache.alloc_id == before[1]


def test_paged_truncate_keeps_the_tail_blocks_until_free():
    ctx, seq = _cache("paged")
    blocks, free = list(seq.blocks), seq.pool.free_blocks
    seq.truncate_to(1)  # blocks 2 and 3 of the sequence hold nothing live now
    assert seq.blocks == blocks and seq.pool.free_blocks == free  # still owned: a rollback re-grows into them
    ctx.decode(seq, 11)
    ctx.decode(seq, 12)
    assert seq.blocks == blocks and seq.pool.free_blocks == free  # no allocation on the way back
    seq.free()
    assert seq.blocks == [] and seq.pool.free_blocks == free + len(blocks)
    assert bool((seq.block_table() == NULL_BLOCK).all())


@pytest.mark.slow
def test_passes_on_inductor(compose_cfg):
    """Both offset paths compile (the symbol path dynamically); six compiles, so slow (~45 s)."""
    result = _run(compose_cfg, "llama", "paged", "backend=inductor")
    assert result.passed, result.detail
