"""DeepSeek-V2 (MLA) on the latent cache: HF parity, absorbed vs expanded, bytes, plans, rebind, weights."""
import dataclasses

import pytest
import torch

from conftest import decode_logits, fed_sequence
from fuelpipe.context import InferenceContext
from fuelpipe.driver import live_key
from fuelpipe.errors import ConfigError, KvCapacityError, KvLayerError
from fuelpipe.kv.latent import LatentKvCache
from fuelpipe.plan.validity import PlanValidity, RebindRefused, RefusalReason
from models.deepseek_v2 import DeepseekV2Model
from models.registry import build_config, build_random_model

PROMPT = [3, 17, 42, 7, 99, 1]
STEPS = 32


def hf_twin(config):
    """A transformers DeepseekV2ForCausalLM with random weights (random norms too), and our copy of it."""
    pytest.importorskip("transformers", reason="transformers is the external oracle (test extra)")
    from fuelpipe.oracles.hf_twin import hf_model, load_from_hf

    torch.manual_seed(0)
    hf = hf_model("deepseek_v2", config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * (torch.rand_like(p) * 2 - 1))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    ours = DeepseekV2Model(config)
    load_from_hf(ours, hf)
    return hf, ours


@pytest.mark.parametrize("size", ["tiny", "tiny_dense"])  # q_lora_rank set (+MoE) / unset (+dense)
def test_matches_transformers_every_step(size):
    config = build_config("deepseek_v2", size)
    assert (config.q_lora_rank is not None) == (size == "tiny")
    hf, ours = hf_twin(config)
    ctx = InferenceContext(ours, "fx")
    rows = decode_logits(ctx, ctx.new_cache(64), PROMPT, STEPS)
    seq = fed_sequence(PROMPT, rows)
    with torch.no_grad():
        want = hf(torch.tensor([seq])).logits[0, len(PROMPT) - 1 :].float()
    err = (torch.stack(rows) - want).abs().max().item()
    assert err <= 1e-4, f"max abs error vs transformers {err}"


@pytest.fixture(scope="module")
def mla():
    return build_random_model("deepseek_v2", "tiny", seed=3)


def test_absorbed_decode_equals_expanded_reference_and_slots_hold_reference_values(mla):
    ctx = InferenceContext(mla, "fx")
    cache = ctx.new_cache(64)
    rows = decode_logits(ctx, cache, PROMPT, STEPS)
    seq = fed_sequence(PROMPT, rows)
    kv_ref = []
    ref = mla.reference_logits(torch.tensor([seq]), kv_out=kv_ref)[0, len(PROMPT) - 1 :]
    assert (torch.stack(rows) - ref).abs().max().item() <= 1e-5
    n = len(seq)
    for layer, (latent, rope_key) in enumerate(kv_ref):
        torch.testing.assert_close(cache.slot(layer, 0)[:n], latent, atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.slot(layer, 1)[:n], rope_key, atol=1e-5, rtol=0)
        assert torch.count_nonzero(cache.slot(layer, 0)[n:]) == 0


def test_kv_bytes_per_token_and_ratio_against_expanded(mla):
    c = mla.config
    for dtype, elem in ((torch.float32, 4), (torch.bfloat16, 2)):
        cache = InferenceContext(mla).new_cache(16, dtype)
        assert cache.bytes_per_token() == c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * elem
        ratio = mla.expanded_kv_bytes_per_token(elem) / cache.bytes_per_token()
        assert ratio == pytest.approx(c.num_attention_heads * (c.qk_head_dim + c.v_head_dim)
                                      / (c.kv_lora_rank + c.qk_rope_head_dim))


def test_plan_once_equals_replan_and_accounting(mla):
    runs = {}
    for plan in ("plan_once", "replan"):
        ctx = InferenceContext(mla, "fx", plan)
        runs[plan] = (ctx, decode_logits(ctx, ctx.new_cache(64), PROMPT, 16))
    assert all(torch.equal(a, b) for a, b in zip(runs["plan_once"][1], runs["replan"][1]))
    once = runs["plan_once"][0]
    assert once.plan.stats.builds == 1 and once.plan.session.realize_count == 15
    assert runs["replan"][0].plan.stats.builds == 16


def test_two_requests_interleaved_equal_solo(mla):
    prompts = (PROMPT, [200, 1, 9])
    solo = []
    for p in prompts:
        ctx = InferenceContext(mla, "fx")
        solo.append(decode_logits(ctx, ctx.new_cache(48), p, 12))
    ctx = InferenceContext(mla, "fx")
    caches = [ctx.new_cache(48), ctx.new_cache(48)]
    rows = [[ctx.prefill(c, p)[0]] for c, p in zip(caches, prompts)]
    for _ in range(12):
        for c, r in zip(caches, rows):
            r.append(ctx.decode(c, int(r[-1].argmax()))[0])
    for r, s in zip(rows, solo):
        assert all(torch.equal(a, b) for a, b in zip(r, s))
    assert ctx.plan.stats.builds == 1 and ctx.plan.stats.rebinds > 0


def test_rebind_onto_latent_caches(mla):
    ctx = InferenceContext(mla, "fx")
    decode_logits(ctx, ctx.new_cache(32), PROMPT, 2)
    session = ctx.plan.session
    same = ctx.new_cache(32)
    assert session.validity_for(live_key(mla, same, 1)) is PlanValidity.ALLOCATION_CHANGED
    session.rebind_kv(same)
    assert session.bound_kv()[1] is same.slot(0, 1)
    c = mla.config
    other = LatentKvCache(c.num_hidden_layers, ((c.kv_lora_rank,), (c.qk_rope_head_dim + 2,)), 32)
    before = session.bound_kv()
    with pytest.raises(RebindRefused) as info:
        session.rebind_kv(other)
    assert info.value.reason is RefusalReason.STORAGE_DIFFERS and info.value.refusal.which == 1
    assert all(a is b for a, b in zip(before, session.bound_kv()))


def test_in_place_update_of_kv_up_projection_is_never_served_stale():
    model = build_random_model("deepseek_v2", "tiny", seed=8)
    ctx = InferenceContext(model, "fx")
    cache = ctx.new_cache(48)
    old_rows = decode_logits(ctx, cache, PROMPT, 4)
    forced = fed_sequence(PROMPT, old_rows)[len(PROMPT):]
    with torch.no_grad():
        model.layers[0].self_attn.kv_b_proj.weight.mul_(-0.7).add_(0.01)
    cache.reset()  # same allocation, same tokens, new weights
    rows = decode_logits(ctx, cache, PROMPT, 4, tokens=forced)
    seq = fed_sequence(PROMPT, rows, forced)
    new_ref = model.reference_logits(torch.tensor([seq]))[0, len(PROMPT) - 1 :]
    assert (torch.stack(rows) - new_ref).abs().max().item() <= 1e-5
    assert (torch.stack(rows) - torch.stack(old_rows)).abs().max().item() > 1e-3  # not the old answer
    assert ctx.plan.stats.builds == 2  # the weights version moved: the plan was rebuilt, not trusted


def test_latent_cache_degenerate_geometry_and_bad_access():
    with pytest.raises(KvCapacityError, match="n_layers must be >= 1, got 0"):
        LatentKvCache(0, ((4,),), 8)
    with pytest.raises(KvCapacityError, match="max_seq_len must be >= 1, got 0"):
        LatentKvCache(1, ((4,),), 0)
    with pytest.raises(KvCapacityError, match="at least one slot"):
        LatentKvCache(1, (), 8)
    with pytest.raises(KvCapacityError, match="trailing dims must be >= 1"):
        LatentKvCache(1, ((0,),), 8)
    cache = LatentKvCache(2, ((4,), (2,)), 8)
    with pytest.raises(KvLayerError, match="slot 2 out of range"):
        cache.slot(0, 2)
    with pytest.raises(KvLayerError, match="layer 5 out of range"):
        cache.slot(5, 0)
    first = cache.alloc_id
    cache.truncate_to(0)
    cache.reset()
    assert cache.alloc_id == first and cache.device_location == torch.device("cpu")
    cache.clear()
    assert cache.alloc_id != first
    cache.set_slot(0, 0, torch.zeros(8, 4))
    assert cache.device_location is None


def test_cache_kind_must_match_the_family(mla, tiny_llama):
    with pytest.raises(ConfigError, match="paged KV is not available for the MLA family 'deepseek_v2'"):
        InferenceContext(mla).new_pool(8, 4)
    llama_ctx = InferenceContext(tiny_llama)
    with pytest.raises(ConfigError, match="needs a latent cache"):
        InferenceContext(mla).prefill(llama_ctx.new_cache(16), [1, 2])
    with pytest.raises(ConfigError, match="not an MLA family"):
        llama_ctx.prefill(InferenceContext(mla).new_cache(16), [1, 2])
