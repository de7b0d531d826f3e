"""A decode step's mask rows read from a MaskRowTable equal mask_variants, at every position and width."""
import pytest
import torch

from fuelpipe.masks import FULL, SLIDING, MaskPlan, MaskRowTable, mask_variants

PLANS = [
    MaskPlan.full(3),
    MaskPlan((SLIDING, SLIDING, FULL), sliding_window=4),
    MaskPlan((FULL, SLIDING), sliding_window=1),
    MaskPlan((SLIDING,), sliding_window=64),  # a window wider than the cache
]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: ",".join(t[:4] for t in p.variants))
@pytest.mark.parametrize("width", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_row_of_the_table_is_mask_variants_bit_for_bit(plan, width, dtype):
    table = MaskRowTable(plan, width, dtype)
    for start in range(width + 3):  # past the width too: computed there, not sliced
        got, want = table.row(start), mask_variants(plan, start, 1, width, dtype)
        assert got.shape == want.shape == (len(plan.variants), 1, 1, 1, width)
        assert got.dtype == dtype
        assert torch.equal(got, want), (start, got, want)


def test_a_table_serves_only_its_own_plan_width_and_dtype():
    plan = MaskPlan((SLIDING, FULL), sliding_window=4)
    table = MaskRowTable(plan, 16, torch.float32)
    assert table.serves(MaskPlan((SLIDING, FULL), sliding_window=4), 16, torch.float32)
    assert not table.serves(MaskPlan((SLIDING, FULL), sliding_window=5), 16, torch.float32)
    assert not table.serves(plan, 17, torch.float32)
    assert not table.serves(plan, 16, torch.bfloat16)


def test_the_context_rebuilds_its_table_when_the_model_or_the_width_changes():
    from fuelpipe.context import InferenceContext
    from models.registry import build_random_model

    ctx = InferenceContext(build_random_model("gemma3", "tiny", seed=0), "eager")
    first = ctx._decode_mask(3, 20)
    assert torch.equal(first, mask_variants(ctx.model.mask_plan, 3, 1, 20, ctx.dtype))
    assert torch.equal(ctx._decode_mask(5, 24), mask_variants(ctx.model.mask_plan, 5, 1, 24, ctx.dtype))
    ctx.switch_model(build_random_model("llama", "tiny", seed=0))  # one variant, no window
    assert torch.equal(ctx._decode_mask(3, 20), mask_variants(ctx.model.mask_plan, 3, 1, 20, ctx.dtype))
