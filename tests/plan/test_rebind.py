"""Guarded rebind: every refusal reason, constructed; a refusal leaves the plan untouched."""
import pytest
import torch

from conftest import PROMPT, decode_logits
from fuelpipe.context import InferenceContext
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.plan.validity import RebindRefused, RefusalReason


def held(model, max_seq_len=32):
    """A context whose plan is built on ``cache``; returns (ctx, cache, logits so far)."""
    ctx = InferenceContext(model, "fx")
    cache = ctx.new_cache(max_seq_len)
    rows = decode_logits(ctx, cache, PROMPT, 2)
    return ctx, cache, rows


def expected_continuation(model, tokens):
    """What the original plan must still produce after a refusal: a fresh, independent run."""
    ctx, cache, _ = held(model)
    return [ctx.decode(cache, t)[0] for t in tokens]


def assert_refused_and_untouched(ctx, cache, model, source, reason):
    session = ctx.plan.session
    before = session.bound_kv()
    key_before = session.key
    with pytest.raises(RebindRefused) as info:
        session.rebind_kv(source)
    assert info.value.reason is reason
    assert all(a is b for a, b in zip(before, session.bound_kv())), "refusal left a half-rebound plan"
    assert session.key == key_before
    # The plan still produces its original outputs on its own cache.
    tokens = [21, 22, 23]
    rows = [ctx.decode(cache, t)[0] for t in tokens]
    want = expected_continuation(model, tokens)
    assert all(torch.equal(a, b) for a, b in zip(rows, want))
    assert ctx.plan.stats.builds == 1
    return info.value


def test_residency_unknown(tiny_llama):
    ctx, cache, _ = held(tiny_llama)
    d = tiny_llama.dims
    src = ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim, 32)
    src.set_layer(0, src.layer(0).k.clone(), src.layer(0).v.clone())  # caller storage: unprovable residency
    assert src.device_location is None
    assert_refused_and_untouched(ctx, cache, tiny_llama, src, RefusalReason.RESIDENCY_UNKNOWN)


def test_residency_differs(tiny_llama):
    ctx, cache, _ = held(tiny_llama)
    d = tiny_llama.dims
    src = ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim, 32, torch.float32, "meta")
    err = assert_refused_and_untouched(ctx, cache, tiny_llama, src, RefusalReason.RESIDENCY_DIFFERS)
    assert err.refusal.baked == "cpu" and err.refusal.incoming == "meta"


def test_missing_slot(tiny_llama):
    ctx, cache, _ = held(tiny_llama)
    d = tiny_llama.dims
    src = ContiguousKvCache.with_capacity(d.n_layers - 1, d.n_kv_heads, d.head_dim, 32)
    err = assert_refused_and_untouched(ctx, cache, tiny_llama, src, RefusalReason.MISSING_SLOT)
    assert err.refusal.layer == d.n_layers - 1


def test_unbaked_slot(tiny_llama):
    ctx, cache, _ = held(tiny_llama)
    ctx.plan.session._drop_bound_slot(1, 1)  # an internal inconsistency in the held plan
    fresh = ctx.new_cache(32)
    with pytest.raises(RebindRefused) as info:
        ctx.plan.session.rebind_kv(fresh)
    assert info.value.reason is RefusalReason.UNBAKED_SLOT and info.value.refusal.layer == 1
    # The driver falls back to a rebuild, which is correct by construction.
    rows = decode_logits(ctx, fresh, PROMPT, 2)
    assert ctx.plan.stats.builds == 2 and len(rows) == 3


@pytest.mark.parametrize("variant", ["capacity", "dtype", "last_layer_only"])
def test_storage_differs(tiny_llama, variant):
    ctx, cache, _ = held(tiny_llama)
    d = tiny_llama.dims
    if variant == "capacity":
        src = ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim, 40)
    elif variant == "dtype":
        src = ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim, 32, torch.bfloat16)
    else:
        # Every slot matches except the last layer's V: staging must catch it before touching layer 0.
        src = ContiguousKvCache.with_capacity(d.n_layers, d.n_kv_heads, d.head_dim, 32)
        src.layers[-1].v = torch.zeros(1, d.n_kv_heads, 33, d.head_dim)
    err = assert_refused_and_untouched(ctx, cache, tiny_llama, src, RefusalReason.STORAGE_DIFFERS)
    if variant == "last_layer_only":
        assert (err.refusal.layer, err.refusal.which) == (d.n_layers - 1, 1)


def test_refused_rebind_falls_back_to_rebuild_in_the_driver(tiny_llama):
    ctx, cache, _ = held(tiny_llama)
    other = ctx.new_cache(40)  # different geometry -> different key anyway (Stale): rebuild
    decode_logits(ctx, other, PROMPT, 2)
    assert ctx.plan.stats.builds == 2 and ctx.plan.stats.rebinds == 0
