"""Plan validity, both halves: what must invalidate, and what must not."""
import dataclasses

import torch

from conftest import PROMPT, decode_logits, fed_sequence
from fuelpipe.context import InferenceContext
from fuelpipe.driver import live_key
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.plan.validity import PlanValidity
from fuelpipe.plan.weights_identity import weights_identity
from fuelpipe.rope import RopePlan, RopeScaling, RopeSpec
from models.llama import LlamaModel
from models.registry import build_config, build_random_model
from fuelpipe.random_init import randomize


def ref_rows(model, seq, n_prompt, rope_plan=None):
    return model.reference_logits(torch.tensor([seq]), rope_plan)[0, n_prompt - 1 :]


def test_different_instance_same_config_is_stale_and_rebuilds_correctly(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx")
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 3)
    twin = build_random_model("llama", "tiny", seed=2)  # same geometry and architecture, other weights
    cache2 = ctx.new_cache(32)
    assert ctx.plan.session.validity_for(live_key(twin, cache2, 1)) is PlanValidity.STALE
    # Serving the twin through the same context rebuilds and is right.
    ctx.switch_model(twin)
    got = decode_logits(ctx, cache2, PROMPT, 4)
    assert ctx.plan.stats.builds == 2
    assert (torch.stack(got) - ref_rows(twin, fed_sequence(PROMPT, got), len(PROMPT))).abs().max() <= 1e-5


def test_different_architecture_same_geometry_is_stale(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx")
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 2)
    other = randomize(LlamaModel(dataclasses.replace(tiny_llama.config, attention_bias=True)), seed=1)
    assert other.dims == tiny_llama.dims
    assert ctx.plan.session.validity_for(live_key(other, cache, 1)) is PlanValidity.STALE


def test_new_allocation_is_allocation_changed_and_rebind_stays_correct(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx")
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 3)
    fresh = ctx.new_cache(32)
    assert ctx.plan.session.validity_for(live_key(tiny_llama, fresh, 1)) is PlanValidity.ALLOCATION_CHANGED
    got = decode_logits(ctx, fresh, [5, 6, 7], 6)
    assert ctx.plan.stats.builds == 1 and ctx.plan.stats.rebinds == 1
    assert ctx.plan.session.bound_kv()[0] is fresh.layer(0).k
    assert (torch.stack(got) - ref_rows(tiny_llama, fed_sequence([5, 6, 7], got), 3)).abs().max() <= 1e-5


def test_truncate_keeps_the_plan_valid_and_correct(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx")
    cache = ctx.new_cache(48)
    got = decode_logits(ctx, cache, PROMPT, 10)
    seq = fed_sequence(PROMPT, got)
    keep = len(PROMPT) + 4
    cache.truncate_to(keep)  # reject a draft: rewind, same allocation
    assert ctx.plan.session.validity_for(live_key(tiny_llama, cache, 1)) is PlanValidity.VALID
    forced = [11, 12, 13, 14]
    rows = [ctx.decode(cache, t)[0] for t in forced]
    assert ctx.plan.stats.builds == 1
    new_seq = seq[:keep] + forced
    ref = tiny_llama.reference_logits(torch.tensor([new_seq]))[0, keep:]
    assert (torch.stack(rows) - ref).abs().max() <= 1e-5


def test_rope_scaling_change_keeps_the_plan_valid_and_correct(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx")
    cache = ctx.new_cache(48)
    decode_logits(ctx, cache, PROMPT, 4)
    d = tiny_llama.dims.head_dim
    scaled = RopePlan.uniform(
        RopeSpec(50000.0, d, RopeScaling("llama3", 8.0, 1.0, 4.0, 16)), tiny_llama.dims.n_layers
    )
    ctx.set_rope_plan(scaled)
    cache.reset()  # same allocation, new conversation
    got = decode_logits(ctx, cache, PROMPT, 8)
    assert ctx.plan.stats.builds == 1 and ctx.plan.session.realize_count == 3 + 8
    ref = ref_rows(tiny_llama, fed_sequence(PROMPT, got), len(PROMPT), scaled)
    assert (torch.stack(got) - ref).abs().max() <= 1e-5
    unscaled = ref_rows(tiny_llama, fed_sequence(PROMPT, got), len(PROMPT))
    assert (torch.stack(got) - unscaled).abs().max() > 1e-4  # the scaling really reached the step


def test_in_place_weight_update_invalidates_derived_weights(tiny_llama):
    model = build_random_model("llama", "tiny", seed=9)
    ctx = InferenceContext(model, "fx")  # the fx plan holds fused (copied) q/k/v weights
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 2)
    with torch.no_grad():
        model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    assert ctx.plan.session.validity_for(live_key(model, cache, 1)) is PlanValidity.STALE
    cache.reset()
    got = decode_logits(ctx, cache, PROMPT, 3)
    assert ctx.plan.stats.builds == 2
    assert (torch.stack(got) - ref_rows(model, fed_sequence(PROMPT, got), len(PROMPT))).abs().max() <= 1e-5


def test_negative_control_session_reused_across_models_is_caught(tiny_llama):
    """With model identity ignored, model B is served A's baked plan; parity against B's reference fails."""
    a = build_random_model("llama", "tiny", seed=1)
    b = build_random_model("llama", "tiny", seed=2)
    ctx = InferenceContext(a, "fx", policy=policy_for(Fault.IGNORE_MODEL_IDENTITY))
    decode_logits(ctx, ctx.new_cache(32), PROMPT, 2)
    ctx.switch_model(b)
    cache = ctx.new_cache(32)
    got = decode_logits(ctx, cache, PROMPT, 4)
    assert ctx.plan.stats.builds == 1  # wrongly reused
    err = (torch.stack(got[1:]) - ref_rows(b, fed_sequence(PROMPT, got), len(PROMPT))[1:]).abs().max()
    assert err > 1e-3


def test_replacing_a_weight_by_assignment_invalidates_the_plan():
    model = build_random_model("llama", "tiny", seed=9)
    ctx = InferenceContext(model, "fx")  # the fx plan holds a fused copy of q/k/v
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 2)
    attn = model.layers[0].self_attn
    attn.q_proj.weight = torch.nn.Parameter(attn.q_proj.weight * 2.0, requires_grad=False)
    assert ctx.plan.session.validity_for(live_key(model, cache, 1)) is PlanValidity.STALE
    cache.reset()
    got = decode_logits(ctx, cache, PROMPT, 3)
    assert ctx.plan.stats.builds == 2
    assert (torch.stack(got) - ref_rows(model, fed_sequence(PROMPT, got), len(PROMPT))).abs().max() <= 1e-5


def test_weights_identity_never_repeats_after_assign_reload():
    """Fresh tensors restart their version counters at 0, so a plain sum of counters can come back to
    a value a held plan was keyed on; the identity of the tensors themselves cannot."""
    model = build_random_model("llama", "tiny", seed=9)
    ctx = InferenceContext(model, "fx")
    cache = ctx.new_cache(32)
    decode_logits(ctx, cache, PROMPT, 2)
    held_sum = sum(ctx.plan.session.key.weights.versions)
    state = {k: v.clone() * 1.1 for k, v in model.state_dict().items()}  # other numbers, fresh tensors
    model.load_state_dict(state, assign=True)
    with torch.no_grad():
        for _ in range(held_sum - sum(weights_identity(model).versions)):
            model.norm.weight.add_(0.0)  # walk the counter sum back to the held value
    assert sum(weights_identity(model).versions) == held_sum
    assert ctx.plan.session.validity_for(live_key(model, cache, 1)) is PlanValidity.STALE
    cache.reset()
    got = decode_logits(ctx, cache, PROMPT, 3)
    assert (torch.stack(got) - ref_rows(model, fed_sequence(PROMPT, got), len(PROMPT))).abs().max() <= 1e-5
