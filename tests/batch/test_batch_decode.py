"""Batched decode through the Python API: ragged rows equal their solo runs, bucket plans, typed refusals."""

import pytest
import torch

from _support.batch_helpers import WIDTH, tiny
from _support.batch_helpers import batch_cache as _batch_cache
from conftest import default_or_slow
from fuelpipe.batch import BatchDecoder, BatchSpec, ContinuousBatcher, Request, Sampling
from fuelpipe.context import InferenceContext
from fuelpipe.driver import live_key
from fuelpipe.errors import ConfigError, InputError, KvCacheError
from fuelpipe.kv.batch import BucketView, KvOutOfSlotsError
from fuelpipe.plan.validity import PlanValidity

PROMPTS = [[3, 17, 42, 7, 99], [5, 6], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [1]]
STEPS = 20  # generated tokens per sequence: gemma3's window (8) is crossed twice
TOL = 1e-5


def _solo(model, offset, layout, prompt):
    ctx = InferenceContext(model, "fx", "plan_once", offset_mode=offset)
    cache = ctx.new_pool(WIDTH // 4 + 1, 4).sequence(WIDTH // 4) if layout == "paged" else ctx.new_cache(WIDTH)
    return ctx.generate(prompt, STEPS, cache=cache, keep_logits=True)


CASES = [(f, o, l) for f in ("llama", "phi", "qwen3", "gemma3") for o in ("tensor", "symbol")
         for l in ("contiguous", "paged")] + [("deepseek_v2", "tensor", "latent")]
KEEP = [("llama", "tensor", "contiguous"), ("gemma3", "symbol", "paged"), ("deepseek_v2", "tensor", "latent")]


@pytest.mark.parametrize("fam,offset,layout", default_or_slow(CASES, KEEP))
def test_ragged_rows_joining_and_leaving_equal_their_solo_runs(fam, offset, layout):
    model = tiny(fam)
    ctx = InferenceContext(model, "fx", "plan_once", offset_mode=offset)
    kv = _batch_cache(ctx, layout)
    dec = BatchDecoder(ctx, kv, BatchSpec(4, (1, 2, 4)))
    outs = [[] for _ in PROMPTS]
    live = []  # [index, handle, last token]

    def step():
        todo = [a for a in live if len(outs[a[0]]) < STEPS]
        logits = dec.step([a[1] for a in todo], [a[2] for a in todo])  # [n, vocab]
        for row, a in zip(logits, todo):
            outs[a[0]].append(row)
            a[2] = int(row.argmax())
            if len(outs[a[0]]) == STEPS:
                kv.release(a[1])  # leaves at once
                live.remove(a)

    for i, prompt in enumerate(PROMPTS):  # each joins after the previous ones ran two steps
        handle = kv.acquire()
        first = ctx.prefill(handle, prompt)[0]
        outs[i].append(first)
        live.append([i, handle, int(first.argmax())])
        for _ in range(2):
            step()
    while live:
        step()
    for i, prompt in enumerate(PROMPTS):
        solo = _solo(model, offset, layout, prompt)
        got = torch.stack(outs[i])
        assert [int(r.argmax()) for r in got] == solo.tokens
        assert float((got - torch.stack(solo.logits)).abs().max()) < TOL
    assert dec.builds == 3 and dec.describe()["builds_per_bucket"] == {1: 1, 2: 1, 4: 1}


def test_bucket_key_both_halves():
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once")
    kv = ctx.new_batch_cache(4, WIDTH)
    dec = BatchDecoder(ctx, kv, BatchSpec(4, (2, 4)))
    rows = [kv.acquire() for _ in range(3)]
    for r in rows:
        ctx.prefill(r, [1, 2, 3])
    dec.step(rows[:2], [4, 5])  # bucket 2
    dec.step(rows, [4, 5, 6])  # bucket 4
    assert dec.builds == 2
    dec.step(rows[1:], [7, 8])  # back to bucket 2 with other rows: its held plan, no build
    dec.step(rows[:1], [9])  # one row: still bucket 2 (padding row), no build
    kv.release(rows[0])
    dec.step(rows[1:], [1, 1])
    assert dec.builds == 2 and dec.plans[2].session.realize_count == 3
    held = dec.plans[2].session
    assert held.validity_for(live_key(model, BucketView(kv, 2), 1)) is PlanValidity.VALID
    assert held.validity_for(live_key(model, BucketView(kv, 4), 1)) is not PlanValidity.VALID
    assert dec.describe()["plans_held"] == 2 and dec.describe()["plan_buffer_bytes"] > 0


def test_padding_rows_never_touch_a_free_or_live_slot():
    model = tiny("qwen3")
    ctx = InferenceContext(model, "eager", "plan_once")
    kv = ctx.new_batch_cache(4, WIDTH)
    dec = BatchDecoder(ctx, kv, BatchSpec(4, (4,)))
    a, b = kv.acquire(), kv.acquire()
    ctx.prefill(a, [1, 2])
    ctx.prefill(b, [3])
    free = [s for s in range(1, 5) if s not in (a.slot, b.slot)]
    for t in kv.bound_tensors():
        t[free] = float("nan")
    before = [t.clone() for t in kv.bound_tensors()]
    logits = dec.step([a, b], [4, 5])  # two padding rows
    assert torch.isfinite(logits).all() and logits.shape == (2, model.dims.vocab_size)
    for t, old in zip(kv.bound_tensors(), before):
        assert torch.isnan(t[free]).all()  # free slots untouched
        assert torch.equal(t[a.slot, :, :2], old[a.slot, :, :2]) and torch.equal(t[b.slot, :, :1], old[b.slot, :, :1])


def test_typed_refusals():
    model = tiny("llama")
    ctx = InferenceContext(model, "eager", "plan_once")
    kv = ctx.new_batch_cache(2, WIDTH)
    dec = BatchDecoder(ctx, kv, 2)
    a, b = kv.acquire(), kv.acquire()
    with pytest.raises(KvOutOfSlotsError, match="all 2 slots are held"):
        kv.acquire()
    ctx.prefill(a, [1])
    ctx.prefill(b, [1])
    with pytest.raises(InputError, match="lists a sequence twice"):
        dec.step([a, a], [1, 2])
    with pytest.raises(InputError, match="one token per row"):
        dec.step([a, b], [1])
    with pytest.raises(InputError, match=r"token ids must lie in \[0, 256\)"):
        dec.step([a, b], [1, 256])
    with pytest.raises(InputError, match="1..batch.max_batch=2 rows, got 0"):
        dec.step([], [])
    kv.release(b)
    with pytest.raises(KvCacheError, match="not held"):
        kv.release(b)
    with pytest.raises(InputError, match="not a live sequence"):
        dec.step([a, b], [1, 2])
    with pytest.raises(KvCacheError, match="storage belongs to its BatchKvCache"):
        a.clear()
    other = InferenceContext(tiny("llama"), "eager").new_cache(WIDTH)
    with pytest.raises(ConfigError, match="needs a batch cache"):
        BatchDecoder(ctx, other)
    with pytest.raises(ConfigError, match="must be integers >= 1"):
        BatchSpec(4, (0, 4))
    with pytest.raises(ConfigError, match="largest bucket must be >= max_batch"):
        BatchSpec(8, (1, 2, 4))
    with pytest.raises(ConfigError, match="max_batch must be an integer >= 1"):
        BatchSpec(0)
    assert BatchSpec(6).buckets == (1, 2, 4, 6)


def test_seeded_requests_draw_the_same_tokens_whatever_their_neighbours():
    model = tiny("gemma3")
    ctx = InferenceContext(model, "fx", "plan_once")
    probe = Request((3, 1, 4, 1, 5), 12, sampling=Sampling(temperature=1.0, top_k=20, seed=11))
    alone = ContinuousBatcher(ctx, ctx.new_batch_cache(4, WIDTH), 4).run([probe])[0]
    crowd = [Request(tuple(range(2, 2 + i)), 6 + i, sampling=Sampling(0.7, 0, seed=i)) for i in range(1, 6)]
    mixed = ContinuousBatcher(ctx, ctx.new_batch_cache(4, WIDTH), 4).run([crowd[0], crowd[1], probe, *crowd[2:]])
    assert mixed[2].tokens == alone.tokens and alone.finish == "length"
    solo = ctx.generate(list(probe.prompt_ids), 12, sampler=probe.sampling.sampler(), max_seq_len=WIDTH)
    assert solo.tokens == alone.tokens


def test_stop_ids_refusals_and_a_short_pool_queue_requests():
    model = tiny("llama")
    ctx = InferenceContext(model, "eager", "plan_once")
    probe = ctx.generate([7, 8, 9], 10, max_seq_len=WIDTH)
    stop = probe.tokens[3]
    kv = ctx.new_paged_batch(ctx.new_pool(1 + 2 * 4, 4), 4, 4)  # blocks for two 16-position requests at a time
    b = ContinuousBatcher(ctx, kv, 4)
    reqs = [Request((7, 8, 9), 10, stop_ids=(stop,)), Request((1,) * 30, 8, name="too-long"),
            *[Request((7, 8, 9), 10) for _ in range(3)]]
    res = b.run(reqs)
    assert res[0].finish == "stop" and res[0].tokens == probe.tokens[: probe.tokens.index(stop) + 1]
    assert res[1].finish == "refused" and "more than a batch row holds" in str(res[1].error)
    for r in res[2:]:
        assert r.finish == "length" and r.tokens == probe.tokens
    assert max(b.batch_sizes) == 2  # the pool holds two requests' blocks: the others waited in the queue
    assert kv.pool.free_blocks == 8  # every block back in the pool
    with pytest.raises(InputError, match="max_new_tokens must be >= 1"):
        b.submit(Request((1,), 0))
    with pytest.raises(InputError, match=r"must lie in \[0, 256\)"):
        b.submit(Request((999,), 2))


def test_room_held_outside_the_batcher_refuses_instead_of_waiting_forever():
    ctx = InferenceContext(tiny("llama"), "eager", "plan_once")
    kv = ctx.new_paged_batch(ctx.new_pool(1 + 4, 4), 2, 4)
    squatter = kv.pool.sequence(4)
    squatter.reserve(12)  # 3 of the 4 blocks, held by hand, never by the batcher
    res = ContinuousBatcher(ctx, kv, 2).run([Request((1, 2, 3), 6), Request((1,), 3)])
    assert res[0].finish == "refused" and "held outside the batcher" in str(res[0].error)
    assert res[1].finish == "length" and len(res[1].tokens) == 3  # one block is enough for it


def test_a_long_lived_decoder_serves_later_batchers_without_rebuilding():
    """A server keeps its cache and decoder: a second run reuses the bucket plans (both halves: a decoder
    over another cache is refused with a typed error, never silently run against the wrong storage)."""
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once")
    kv = ctx.new_batch_cache(4, WIDTH)
    decoder = BatchDecoder(ctx, kv, 4)
    requests = [Request(tuple(p), 6) for p in PROMPTS]
    first = ContinuousBatcher(ctx, kv, 4, decoder=decoder).run(requests)
    builds = decoder.builds
    again = ContinuousBatcher(ctx, kv, 4, decoder=decoder).run(requests)
    assert [r.tokens for r in again] == [r.tokens for r in first]
    assert decoder.builds == builds  # every bucket plan was reused
    fresh = ContinuousBatcher(ctx, ctx.new_batch_cache(4, WIDTH), 4).run(requests)
    assert [r.tokens for r in fresh] == [r.tokens for r in first]
    with pytest.raises(InputError, match="serves another cache"):
        ContinuousBatcher(ctx, ctx.new_batch_cache(4, WIDTH), 4, decoder=decoder)


def test_a_request_samples_with_its_own_top_p_min_p_and_repetition_penalty():
    """Each request's sampler is ``sampler_for`` of its settings, its penalty history starting with its prompt."""
    from fuelpipe.sampling import SamplingParams, sampler_for

    ctx = InferenceContext(tiny("llama"), "eager", "plan_once")
    prompt = [3, 17, 42, 7, 99]
    probe = Sampling(temperature=0.8, top_k=0, seed=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3)
    greedy_probe = Sampling(repetition_penalty=1.5)
    res = ContinuousBatcher(ctx, ctx.new_batch_cache(4, WIDTH), 4).run([
        Request(tuple(prompt), 12, sampling=probe), Request((5, 6), 9),
        Request(tuple(prompt), 12, sampling=greedy_probe)])
    for got, sampling in ((res[0], probe), (res[2], greedy_probe)):
        solo = ctx.generate(prompt, 12, sampler=sampler_for(sampling.params(), prompt), max_seq_len=WIDTH)
        assert got.tokens == solo.tokens
    assert res[2].tokens != ctx.generate(prompt, 12, max_seq_len=WIDTH).tokens  # the control: the penalty acts
    with pytest.raises(ConfigError, match=r"top_p must lie in \(0, 1\] \(1 = off\), got 1.5"):
        Sampling(top_p=1.5)


def test_cancel_frees_the_row_for_the_next_request():
    ctx = InferenceContext(tiny("llama"), "eager", "plan_once")
    kv = ctx.new_batch_cache(1, WIDTH)
    b = ContinuousBatcher(ctx, kv, 1)
    first, second, third = (b.submit(Request((1, 2, 3), 20)) for _ in range(3))
    b.step()
    assert (first.finish, second.finish) == ("running", "queued")
    assert b.cancel(third) and third.finish == "cancelled"  # a queued one leaves the queue
    assert b.cancel(first) and first.finish == "cancelled" and kv.free_rows
    assert not b.cancel(first)  # already finished
    b.step()
    assert second.finish == "running" and second.admitted_step == b.decoder.steps - 1
    while b.step():
        pass
    assert second.finish == "length" and len(second.tokens) == 20 and len(first.tokens) < 20
    assert b.describe()["cancelled"] == 2 and kv.free_rows
