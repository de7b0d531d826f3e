"""The prompt step as a held program: built once, reused for every prompt length, rebuilt when its key changes.

Both halves of validity: a second prompt (any length) reuses the program; an in-place weight
update rebuilds it, and the logits follow the new weights (a program that kept its derived
weight copies would answer with the old ones: shown by the key without the weights' identity).
"""
from __future__ import annotations

import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.plan import prefill_program
from fuelpipe.plan.backends import BackendSpec
from models.registry import build_random_model

# The panel form explicitly: its weights are copies, so a stale program would show.
PANELS = BackendSpec("fx", ("fuse_sibling_linears", "pack_linears_into_panels", "eliminate_dead_code_keeping_writes"))


@pytest.fixture
def model():
    return build_random_model("llama", "tiny", seed=11, hidden_size=256, intermediate_size=512,
                              num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=1024)


def _prefill(ctx, ids):
    return ctx.prefill(ctx.new_cache(64), ids)


@pytest.mark.parametrize("backend", ["fx", "inductor"])
def test_one_program_serves_every_prompt_length_and_matches_eager(model, backend):
    ctx, eager = InferenceContext(model, BackendSpec(backend)), InferenceContext(model, "eager")
    for ids in ([1, 2, 3], list(range(5, 45)), [7]):
        torch.testing.assert_close(_prefill(ctx, ids), _prefill(eager, ids), rtol=0, atol=1e-4)
    assert ctx.prefill_plans.builds == 1
    assert eager.prefill_plans.builds == 0 and eager.prefill_plans.eager  # the eager backend keeps the eager step


def test_a_compiled_prompt_program_serves_every_length_and_matches_eager(model):
    """backend.compile_prompt: one dynamic-shape compile, every prompt length, the eager reference's logits."""
    from fuelpipe.plan.prefill_program import _CompiledOnFirstCall

    ctx = InferenceContext(model, BackendSpec("inductor", compile_prompt=True))
    eager = InferenceContext(model, "eager")
    traced_only = InferenceContext(model, BackendSpec("inductor"))
    for ids in ([1, 2, 3], list(range(5, 45)), [7, 8], list(range(9, 30))):
        torch.testing.assert_close(_prefill(ctx, ids), _prefill(eager, ids), rtol=0, atol=1e-4)
        _prefill(traced_only, ids)
    assert ctx.prefill_plans.builds == 1
    (program,) = ctx.prefill_plans.programs.values()
    assert isinstance(program.fn, _CompiledOnFirstCall) and not program.fn.first
    # the compile (its first call) is counted as build time, beside the trace
    assert program.fn.compile_s > 0
    assert ctx.prefill_plans.build_s == pytest.approx(program.build_s + program.fn.compile_s)
    assert not isinstance(next(iter(traced_only.prefill_plans.programs.values())).fn, _CompiledOnFirstCall)


def test_the_program_and_a_held_decode_plan_continue_the_same_sequence(model):
    ctx, eager = InferenceContext(model, "fx"), InferenceContext(model, "eager")
    caches = [c.new_cache(32) for c in (ctx, eager)]
    for c, cache in zip((ctx, eager), caches):
        c.prefill(cache, [3, 1, 4, 1, 5])
    for t in (9, 2, 6):
        torch.testing.assert_close(ctx.decode(caches[0], t), eager.decode(caches[1], t), rtol=0, atol=1e-4)


def _before_and_after_an_update(model):
    """Prefill, double the head in place, prefill again: (context, logits before, logits after)."""
    ctx = InferenceContext(model, PANELS)
    before = _prefill(ctx, [1, 2, 3])
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return ctx, before, _prefill(ctx, [1, 2, 3])


def test_an_in_place_weight_update_rebuilds_the_program(model):
    ctx, before, after = _before_and_after_an_update(model)
    assert ctx.prefill_plans.builds == 2
    torch.testing.assert_close(after, _prefill(InferenceContext(model, "eager"), [1, 2, 3]), rtol=0, atol=1e-4)
    assert not torch.allclose(after, before)


def test_a_key_without_the_weights_identity_would_serve_stale_weights(model, monkeypatch):
    """The negative control of the key: with the identity left out, the update is silently ignored."""
    monkeypatch.setattr(prefill_program, "weights_identity", lambda m: None)
    ctx, before, stale = _before_and_after_an_update(model)
    assert ctx.prefill_plans.builds == 1
    assert torch.equal(stale, before)  # the old copies answered: exactly the bug the key prevents


def test_switching_the_model_drops_the_programs(model):
    ctx = InferenceContext(model, "fx")
    _prefill(ctx, [1, 2])
    other = build_random_model("llama", "tiny", seed=12, hidden_size=256, intermediate_size=512,
                               num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=1024)
    ctx.switch_model(other)
    torch.testing.assert_close(_prefill(ctx, [1, 2]), _prefill(InferenceContext(other, "eager"), [1, 2]),
                               rtol=0, atol=1e-4)
