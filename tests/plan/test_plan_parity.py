"""plan_once vs replan (bit-exact) and cached decode vs the no-cache reference."""
import pytest
import torch

from conftest import PROMPT, decode_logits, fed_sequence
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for

STEPS = 32


def run(model, backend, plan, steps=STEPS, **kw):
    ctx = InferenceContext(model, backend, plan, **kw)
    cache = ctx.new_cache(64)
    return ctx, cache, decode_logits(ctx, cache, PROMPT, steps)


@pytest.mark.parametrize("offset_mode", ["tensor", "symbol"])
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_plan_once_equals_replan_bit_exact(tiny_llama, backend, offset_mode):
    _, _, once = run(tiny_llama, backend, "plan_once", offset_mode=offset_mode)
    _, _, replan = run(tiny_llama, backend, "replan", offset_mode=offset_mode)
    assert len(once) == STEPS + 1
    for step, (a, b) in enumerate(zip(once, replan)):
        assert torch.equal(a, b), f"first divergence at step {step}"


@pytest.mark.parametrize("offset_mode", ["tensor", "symbol"])
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_cached_decode_matches_reference_and_kv_holds_the_writes(tiny_llama, backend, offset_mode):
    ctx, cache, got = run(tiny_llama, backend, "plan_once", offset_mode=offset_mode)
    seq = fed_sequence(PROMPT, got)
    kv_ref: list = []
    ref = tiny_llama.reference_logits(torch.tensor([seq]), kv_out=kv_ref)[0, len(PROMPT) - 1 :]
    err = (torch.stack(got) - ref).abs().max().item()
    assert err <= 1e-5, f"max abs error {err}"
    n = len(seq)
    assert cache.cached_len == n
    for i, (k_ref, v_ref) in enumerate(kv_ref):
        layer = cache.layer(i)
        torch.testing.assert_close(layer.k[0, :, :n], k_ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(layer.v[0, :, :n], v_ref, atol=1e-5, rtol=0)
        assert torch.count_nonzero(layer.k[0, :, n:]) == 0


def test_negative_control_naive_dce_drops_kv_writes_and_is_caught(tiny_llama):
    """A graph pass that deletes in-place KV writes as dead code must not go unnoticed.

    On the symbol path the write (narrow().copy_()) has no data consumer, so torch.fx's
    default DCE deletes it; the tensor path reads the write's result and is immune by construction.
    """
    ctx, cache, got = run(tiny_llama, "fx", "plan_once", steps=8, policy=policy_for(Fault.NAIVE_DCE), offset_mode="symbol")
    seq = fed_sequence(PROMPT, got)
    ref = tiny_llama.reference_logits(torch.tensor([seq]))[0, len(PROMPT) - 1 :]
    err = (torch.stack(got) - ref).abs().max().item()
    assert err > 1e-3, "parity check failed to catch dropped KV writes"
    # The decode positions of the cache were never written.
    assert torch.count_nonzero(cache.layer(0).k[0, :, len(PROMPT) + 1 : len(seq)]) == 0


def test_negative_control_stale_offset_is_caught_by_plan_vs_replan(tiny_llama):
    _, _, stale = run(tiny_llama, "fx", "plan_once", steps=8, policy=policy_for(Fault.STALE_OFFSET))
    _, _, replan = run(tiny_llama, "fx", "replan", steps=8)
    diverged = [i for i, (a, b) in enumerate(zip(stale, replan)) if not torch.equal(a, b)]
    assert diverged, "plan_vs_replan failed to catch a stale offset binding"
    assert diverged[0] == 2  # token 1 builds (fresh offset); the first reused token writes stale


@pytest.fixture(scope="module")
def inductor_runs(tiny_llama):
    """Compile the tiny model once for the module: plan_once arm plus a warm-cache replan arm."""
    steps = 4
    ctx, cache, once = run(tiny_llama, "inductor", "plan_once", steps=steps)
    _, _, replan = run(tiny_llama, "inductor", "replan", steps=steps)
    return ctx, cache, once, replan


def test_inductor_plan_once_equals_replan_and_reference(inductor_runs, tiny_llama):
    ctx, cache, once, replan = inductor_runs
    for step, (a, b) in enumerate(zip(once, replan)):
        assert torch.equal(a, b), f"first divergence at step {step}"
    seq = fed_sequence(PROMPT, once)
    ref = tiny_llama.reference_logits(torch.tensor([seq]))[0, len(PROMPT) - 1 :]
    assert (torch.stack(once) - ref).abs().max().item() <= 1e-5
    session = ctx.plan.session
    # The offset is a tensor input: no recompile per token.
    assert ctx.plan.stats.builds == 1 and session.realize_count == 3 and session.compiles == 1


def test_bf16_decode_matches_reference_within_bf16_tolerance():
    from models.registry import build_random_model

    model = build_random_model("llama", "tiny", seed=4, dtype=torch.bfloat16)
    ctx, cache, got = run(model, "fx", "plan_once", steps=8)
    assert cache.dtype == torch.bfloat16
    seq = fed_sequence(PROMPT, got)
    ref = model.reference_logits(torch.tensor([seq]))[0, len(PROMPT) - 1 :]
    assert (torch.stack(got) - ref).abs().max().item() <= 2e-2
    _, _, replan = run(model, "fx", "replan", steps=8)
    assert all(torch.equal(a, b) for a, b in zip(got, replan))
