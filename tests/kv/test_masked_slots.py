"""Masked KV slots contribute exactly nothing, whatever they hold: NaN and Inf poison, every KV strategy and path.

An additive -inf mask zeroes a slot's softmax weight, but 0 x NaN is NaN: a
recycled paged block, a reused cache or the null block would turn every logit
of the row into NaN. Each case fills every slot of the cache with poison
before the prefill (so everything the sequence did not write is poison) and
compares against the same run on a clean cache, bit for bit.
"""
import pytest
import torch

from conftest import PROMPT, default_or_slow
from fuelpipe.context import InferenceContext
from fuelpipe.errors import NonFiniteLogitsError
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.sampling import greedy
from models.registry import build_random_model

TOKENS = [5, 9, 2, 31, 7, 11]
POISONS = [float("nan"), float("inf"), float("-inf")]
# (family, kv, offset_mode): every KV strategy on both offset paths
PATHS = [
    ("llama", "contiguous", "tensor"),
    ("llama", "contiguous", "symbol"),
    ("gemma3", "contiguous", None),  # sliding layers: slots masked by the window, not only by length
    ("llama", "paged", "tensor"),
    ("qwen3", "paged", "symbol"),
    ("deepseek_v2", "latent", None),
]


def new_cache(ctx, kv):
    if kv == "paged":
        pool = ctx.new_pool(num_blocks=12, block_size=4)
        pool.scramble_free_list(seed=1)  # non-contiguous physical blocks
        return pool.sequence(max_blocks_cap=5)
    return ctx.new_cache(20)


def rows(model, kv, offset_mode, backend, poison=None, fault=Fault.NONE):
    ctx = InferenceContext(model, backend, offset_mode=offset_mode, policy=policy_for(fault))
    cache = new_cache(ctx, kv)
    if poison is not None:
        for t in cache.bound_tensors():
            t.fill_(poison)  # the null block and every unwritten slot included
    out = [ctx.prefill(cache, PROMPT)[0]]
    out += [ctx.decode(cache, t)[0] for t in TOKENS]
    return torch.stack(out)


CASES = [(*path, backend) for path in PATHS for backend in ("eager", "fx")]


@pytest.mark.parametrize("family,kv,offset_mode,backend", default_or_slow(
    CASES, [(*path, "fx") for path in PATHS] + [("llama", "paged", "tensor", "eager")]))
def test_poisoned_masked_slots_change_nothing(family, kv, offset_mode, backend):
    model = build_random_model(family, "tiny", seed=2)
    clean = rows(model, kv, offset_mode, backend)
    for poison in POISONS:
        got = rows(model, kv, offset_mode, backend, poison)
        assert torch.isfinite(got).all(), f"{poison} in a masked slot reached the logits"
        assert torch.equal(clean, got), poison


def test_unsafe_masking_fault_is_what_the_poison_catches():
    """Negative control: with masked slots passed through as they are, NaN poison reaches the logits."""
    model = build_random_model("llama", "tiny", seed=2)
    got = rows(model, "paged", "tensor", "fx", float("nan"), Fault.UNSAFE_MASKED_SLOTS)
    assert torch.isnan(got[1:]).all()


def test_non_finite_logits_are_an_error_never_token_zero():
    model = build_random_model("llama", "tiny", seed=2)
    with torch.no_grad():
        model.norm.weight[0] = float("nan")
    ctx = InferenceContext(model, "fx")
    with pytest.raises(NonFiniteLogitsError, match="non-finite"):
        ctx.generate(PROMPT, 4)
    with pytest.raises(NonFiniteLogitsError):
        greedy(torch.tensor([[0.0, float("nan"), 1.0]]))
