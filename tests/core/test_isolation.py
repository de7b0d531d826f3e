"""Two requests, one model, separate caches, decoded interleaved: each equals its solo run."""
import pytest
import torch

from conftest import decode_logits
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for

PROMPT_A = [3, 17, 42, 7, 99]
PROMPT_B = [250, 1, 2, 128]
STEPS = 16


def solo(model, backend, prompt, offset_mode):
    ctx = InferenceContext(model, backend, offset_mode=offset_mode)
    return decode_logits(ctx, ctx.new_cache(48), prompt, STEPS)


def interleaved(model, backend, offset_mode, fault=Fault.NONE):
    ctx = InferenceContext(model, backend, offset_mode=offset_mode, policy=policy_for(fault))
    ca, cb = ctx.new_cache(48), ctx.new_cache(48)
    rows_a = [ctx.prefill(ca, PROMPT_A)[0]]
    rows_b = [ctx.prefill(cb, PROMPT_B)[0]]
    for _ in range(STEPS):
        rows_a.append(ctx.decode(ca, int(rows_a[-1].argmax()))[0])
        rows_b.append(ctx.decode(cb, int(rows_b[-1].argmax()))[0])
    return ctx, rows_a, rows_b


@pytest.mark.parametrize("offset_mode", ["tensor", "symbol"])
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_interleaved_requests_equal_their_solo_runs(tiny_llama, backend, offset_mode):
    ctx, a, b = interleaved(tiny_llama, backend, offset_mode)
    assert all(torch.equal(x, y) for x, y in zip(a, solo(tiny_llama, backend, PROMPT_A, offset_mode)))
    assert all(torch.equal(x, y) for x, y in zip(b, solo(tiny_llama, backend, PROMPT_B, offset_mode)))
    # One plan served both: rebound between requests, never rebuilt.
    assert ctx.plan.stats.builds == 1 and ctx.plan.stats.rebinds == 2 * STEPS - 1


def test_negative_control_geometry_only_keying_mixes_requests(tiny_llama):
    """Ignoring the allocation hands request B a plan welded to A's KV: caught by the isolation check."""
    _, a, b = interleaved(tiny_llama, "fx", "tensor", fault=Fault.IGNORE_ALLOCATION)
    solo_b = solo(tiny_llama, "fx", PROMPT_B, "tensor")
    assert not all(torch.equal(x, y) for x, y in zip(b, solo_b))
