"""A held plan's weight identity comes from the tensors themselves: Python-level mutation cannot fool it.

Each case changes the weights under a held plan through a route that bypasses
hooks (deep copy, ``.data =``, a replaced submodule, ``copy_``) and asserts
the plan is rebuilt and serves the changed model's own answer bit-exactly.
"""
import copy

import pytest
import torch
from torch import nn

from conftest import PROMPT, default_or_slow
from fuelpipe.context import InferenceContext
from fuelpipe.driver import live_key
from fuelpipe.oracles import weight_mutations
from fuelpipe.plan.validity import PlanValidity
from fuelpipe.plan.weights_identity import weights_identity
from models.registry import build_random_model

CASES = [("llama", "eager"), ("llama", "fx"), ("gemma3", "fx"), ("deepseek_v2", "fx")]


def fresh_rows(model, backend, token):
    ctx = InferenceContext(model, backend)
    cache = ctx.new_cache(16)
    return [ctx.prefill(cache, PROMPT)[0], ctx.decode(cache, token)[0]]


def held_on(model, backend):
    """A context holding a plan built on ``model`` (prefill + one decode token)."""
    ctx = InferenceContext(model, backend)
    cache = ctx.new_cache(16)
    token = int(torch.argmax(ctx.prefill(cache, PROMPT)[0]))
    ctx.decode(cache, token)
    return ctx, token


@pytest.mark.parametrize("family,backend", CASES)
def test_deepcopy_twins_never_share_a_plan(family, backend):
    """Two deep copies of one template, loaded with different weights: A's plan must not serve B."""
    template = build_random_model(family, "tiny", seed=3)
    a, b = copy.deepcopy(template), copy.deepcopy(template)
    a.load_state_dict({k: v.clone() for k, v in template.state_dict().items()})
    b.load_state_dict(weight_mutations.scaled_state(template))  # same number of in-place writes as A
    assert len({template.instance_id, a.instance_id, b.instance_id}) == 3
    assert len({template.shape_key(), a.shape_key(), b.shape_key()}) == 3
    ctx, token = held_on(a, backend)
    other = InferenceContext(b, backend)
    other.plan = ctx.plan
    cache = other.new_cache(16)
    got = [other.prefill(cache, PROMPT)[0], other.decode(cache, token)[0]]
    assert ctx.plan.stats.last_validity is PlanValidity.STALE and ctx.plan.stats.builds == 2
    want = fresh_rows(b, backend, token)
    assert all(torch.equal(w, g) for w, g in zip(want, got))


def test_weight_identity_alone_separates_twins_with_one_instance_id():
    """Defence in depth: even with the instance id forced equal, the tensors tell the copies apart."""
    a = build_random_model("llama", "tiny", seed=3)
    b = copy.deepcopy(a)
    b.instance_id, b._shape_key = a.instance_id, None
    assert a.shape_key() == b.shape_key()
    assert weights_identity(a) != weights_identity(b)


@pytest.mark.parametrize("mutation", list(weight_mutations.MUTATIONS))
@pytest.mark.parametrize("family,backend", default_or_slow(CASES, [("llama", "eager"), ("gemma3", "fx")]))
def test_mutation_under_held_plan_rebuilds(family, backend, mutation):
    model = build_random_model(family, "tiny", seed=4)
    ctx, token = held_on(model, backend)
    weight_mutations.MUTATIONS[mutation](model)
    cache = ctx.new_cache(16)
    got = [ctx.prefill(cache, PROMPT)[0], ctx.decode(cache, token)[0]]
    assert ctx.plan.stats.last_validity is PlanValidity.STALE, mutation
    assert ctx.plan.stats.builds == 2
    want = fresh_rows(model, backend, token)
    assert torch.equal(want[1], got[1])


def test_data_assign_on_a_fused_sibling_is_seen():
    """The issue's case: ``up_proj.weight.data = t`` under an fx plan that fused gate/up."""
    model = build_random_model("llama", "tiny", seed=5)
    ctx, token = held_on(model, "fx")
    assert ctx.plan.session.program.passes_applied["fuse_sibling_linears"] > 0
    up = model.layers[0].mlp.up_proj
    cache = ctx.new_cache(16)
    ctx.prefill(cache, PROMPT)
    before = ctx.decode(cache, token)[0]
    up.weight.data = torch.randn_like(up.weight)
    held = ctx.plan.session.key
    live = live_key(model, cache, 1)
    assert held.compare(live) is PlanValidity.STALE
    assert any("storage swapped" in d and "up_proj" in d for d in held.differences(live))
    cache.reset()
    ctx.prefill(cache, PROMPT)
    got = ctx.decode(cache, token)[0]
    want = fresh_rows(model, "fx", token)[1]
    assert torch.equal(want, got) and not torch.equal(before, got)


def test_replaced_submodule_is_seen():
    model = build_random_model("qwen3", "tiny", seed=6)
    ctx, _ = held_on(model, "fx")
    attn = model.layers[1].self_attn
    attn.k_proj = nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=False).requires_grad_(False)
    held = ctx.plan.session.key
    live = live_key(model, ctx.new_cache(16), 1)
    assert held.compare(live) is PlanValidity.STALE
    assert "weights: a submodule was replaced, added or removed" in held.differences(live)


def test_unchanged_model_keeps_its_identity_and_its_plan():
    """The other half: reading the identity, running steps, rebinding caches never moves it."""
    model = build_random_model("llama", "tiny", seed=7)
    before = weights_identity(model)
    ctx, token = held_on(model, "fx")
    for _ in range(3):
        cache = ctx.new_cache(16)
        ctx.prefill(cache, PROMPT)
        ctx.decode(cache, token)
    assert weights_identity(model) == before
    assert ctx.plan.stats.builds == 1 and ctx.plan.stats.rebinds == 3


def test_plan_pins_what_its_identity_names():
    """A storage swapped out under a held plan stays alive, so its address cannot be handed to a newcomer."""
    model = build_random_model("llama", "tiny", seed=8)
    ctx, _ = held_on(model, "fx")
    w = model.layers[0].self_attn.q_proj.weight
    old_ptr = w.data_ptr()
    w.data = w.detach().clone()
    assert any(t.data_ptr() == old_ptr for t in ctx.plan.session._weights_pin.storages)
