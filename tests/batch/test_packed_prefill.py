"""The packed prompt step: several fresh sequences' prompts in one call, each equal to its own prefill."""
import dataclasses

import pytest
import torch

from _support import batch_helpers
from _support.batch_helpers import WIDTH
from _support.batch_helpers import batch_cache as _batch_cache
from conftest import default_or_slow
from fuelpipe.batch import BatchDecoder, BatchSpec, ContinuousBatcher, Request
from fuelpipe.batch.packed_prefill import pack_prompts, packed_mask_variants
from fuelpipe.context import InferenceContext
from fuelpipe.errors import InputError, KvCacheError
from fuelpipe.oracles.faults import Fault
from fuelpipe.kv.paged import KvOutOfBlocksError
from fuelpipe.masks import MaskPlan
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one

# ragged, one of a single token, one longer than gemma3's tiny sliding window (8)
PROMPTS = [[3, 17, 42, 7, 99], [5, 6], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [1]]
TOL = 1e-5


def tiny(fam):
    return batch_helpers.tiny(fam, seed=5)


def _written(kv, handle, layout, n):
    """Every layer's K/V (or latents) the sequence holds at positions [0, n), flattened and joined."""
    if layout == "paged":
        bs = kv.pool.block_size
        idx = torch.tensor([handle.blocks[p // bs] * bs + p % bs for p in range(n)])
        return torch.cat([t.view(-1, *t.shape[2:])[idx].reshape(-1) for t in kv.bound_tensors()])
    return torch.cat([t[handle.slot].narrow(-2 if t.dim() == 4 else 0, 0, n).reshape(-1)
                        for t in kv.bound_tensors()])


CASES = [(f, b, l) for f in ("llama", "phi", "qwen3", "gemma3") for b in ("eager", "fx")
         for l in ("contiguous", "paged")] + [("deepseek_v2", b, "latent") for b in ("eager", "fx")]
KEEP = [("llama", "fx", "contiguous"), ("gemma3", "fx", "paged"), ("deepseek_v2", "fx", "latent"),
        ("phi", "eager", "contiguous")]


@pytest.mark.parametrize("fam,backend,layout", default_or_slow(CASES, KEEP))
def test_packed_prompts_equal_each_prompt_alone(fam, backend, layout):
    """Logits and every written K/V row equal the one-sequence prefill's; the next decode step agrees too."""
    model = tiny(fam)
    ctx = InferenceContext(model, backend, "plan_once")
    packed_kv, solo_kv = _batch_cache(ctx, layout), _batch_cache(ctx, layout)
    dec = BatchDecoder(ctx, packed_kv, BatchSpec(4))
    rows = [packed_kv.acquire() for _ in PROMPTS]
    logits = dec.prefill(rows, PROMPTS)  # [4, vocab]
    assert logits.shape == (len(PROMPTS), model.dims.vocab_size)
    solo_dec = BatchDecoder(ctx, solo_kv, BatchSpec(4))
    solo_rows = [solo_kv.acquire() for _ in PROMPTS]
    solo = torch.cat([ctx.prefill(h, p) for h, p in zip(solo_rows, PROMPTS)])
    assert float((logits - solo).abs().max()) < TOL
    for h, s, p in zip(rows, solo_rows, PROMPTS):
        assert h.cached_len == len(p) == s.cached_len
        assert torch.allclose(_written(packed_kv, h, layout, len(p)), _written(solo_kv, s, layout, len(p)),
                              atol=TOL, rtol=0)
    nxt = [int(r.argmax()) for r in logits]
    a, b = dec.step(rows, nxt), solo_dec.step(solo_rows, nxt)
    assert float((a - b).abs().max()) < TOL


def test_the_mask_is_block_diagonal_causal_and_windowed():
    packed = pack_prompts([[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    assert packed.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert packed.segment.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert packed.last_index.tolist() == [2, 4, 8]
    plan = MaskPlan(("full_attention", "sliding_attention"), sliding_window=2)
    mask = packed_mask_variants(plan, packed.positions, packed.segment, torch.float32)  # [2, 1, 1, 9, 9]
    ok = mask[:, 0, 0] == 0
    assert ok[0, 4].tolist() == [False, False, False, True, True, False, False, False, False]  # token 4: own 2
    assert ok[0, 8].tolist() == [False] * 5 + [True] * 4
    assert ok[1, 8].tolist() == [False] * 7 + [True] * 2  # window 2: itself and the one before


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_a_prompt_that_sees_another_is_caught_by_batch_vs_solo(compose_cfg, kv):
    """The negative control: a mask causal over the whole packed row lets later prompts attend earlier ones."""
    cfg = compose_cfg(["model=llama_tiny", f"kv={kv}", "batch.max_batch=4", "batch.buckets=[1,2,4]",
                       "experiment.new_tokens=6", "experiment.oracles.batch_vs_solo.inject_fault=true"])
    spec = dataclasses.replace(ORACLES["batch_vs_solo"], fault=Fault.PACKED_PREFILL_CROSS_ROWS)
    bad = run_one(cfg, assemble(cfg), spec)
    assert not bad.passed and "differ" in bad.detail, bad.detail


def test_the_batcher_runs_joining_prompts_in_one_call():
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once")
    kv = ctx.new_batch_cache(4, WIDTH)
    b = ContinuousBatcher(ctx, kv, 4)
    reqs = [Request(tuple(p), 6, name=str(i)) for i, p in enumerate(PROMPTS + [[2, 3, 4]])]
    results = b.run(reqs)
    assert b.prefill_calls == 2  # four join at once; the fifth when a row frees
    for r, p in zip(results, PROMPTS + [[2, 3, 4]]):
        solo = ctx.generate(p, 6)
        assert r.tokens == solo.tokens


def test_typed_refusals_leave_every_sequence_untouched():
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once")
    kv = ctx.new_batch_cache(3, WIDTH)
    dec = BatchDecoder(ctx, kv, BatchSpec(3))
    a, b = kv.acquire(), kv.acquire()
    vocab = model.dims.vocab_size
    with pytest.raises(InputError, match="one prompt per sequence"):
        dec.prefill([a, b], [[1, 2]])
    with pytest.raises(InputError, match="twice"):
        dec.prefill([a, a], [[1], [2]])
    with pytest.raises(InputError, match="empty"):
        dec.prefill([a, b], [[1], []])
    with pytest.raises(InputError, match=rf"\[0, {vocab}\)"):
        dec.prefill([a, b], [[1], [vocab]])
    with pytest.raises(KvCacheError, match=f"{WIDTH} positions"):
        dec.prefill([a, b], [[1], [1] * (WIDTH + 1)])
    assert a.cached_len == b.cached_len == 0
    dec.prefill([a], [[1, 2, 3]])
    with pytest.raises(InputError, match="fresh sequences only.*3 positions"):
        dec.prefill([a, b], [[4], [5]])
    assert (a.cached_len, b.cached_len) == (3, 0)
    kv.release(b)
    with pytest.raises(InputError, match="not a live sequence"):
        dec.prefill([b], [[1]])


def test_a_short_pool_refuses_before_taking_any_block():
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once")
    pool = ctx.new_pool(5, 4)  # 4 usable blocks
    kv = ctx.new_paged_batch(pool, 2, 8)
    dec = BatchDecoder(ctx, kv, BatchSpec(2))
    a, b = kv.acquire(), kv.acquire()
    with pytest.raises(KvOutOfBlocksError, match="need 5 more blocks.*4 free"):
        dec.prefill([a, b], [[1] * 8, [2] * 9])
    assert pool.free_blocks == 4 and a.blocks == [] and b.blocks == []
