"""Gemma 3 (text): local/global layers as data, scaled embedding, (1 + w) norms, soft-capped logits."""
from __future__ import annotations

import math

import pytest
import torch

from _support.family_helpers import forced_tokens, run_decode
from fuelpipe.errors import ConfigError
from fuelpipe.masks import FULL, SLIDING
from fuelpipe.rope import RopeScaling
from models.gemma3 import Gemma3Model, gemma3_tiny
from models.registry import build_random_model


def test_five_local_one_global_with_their_own_window_and_rope():
    model = Gemma3Model(gemma3_tiny(num_hidden_layers=12), device="meta")
    kinds = model.mask_plan.layer_types
    assert [i for i, k in enumerate(kinds) if k == FULL] == [5, 11]
    assert model.mask_plan.window_of(SLIDING) == 8 and model.mask_plan.window_of(FULL) is None
    specs = [model.rope_plan.specs[s] for s in model.rope_plan.layer_spec]
    for kind, spec in zip(kinds, specs):
        if kind == SLIDING:
            assert spec.theta == 10_000.0 and spec.scaling == RopeScaling()
        else:
            assert spec.theta == 1_000_000.0 and spec.scaling == RopeScaling("linear", 2.0)


def test_rope_bases_and_scaling_are_per_token_data():
    base = Gemma3Model(gemma3_tiny(), device="meta").structure()
    other = gemma3_tiny(rope_theta=5e5, rope_local_base_freq=2e4, rope_scaling=RopeScaling("linear", 8.0))
    assert Gemma3Model(other, device="meta").structure() == base
    assert Gemma3Model(gemma3_tiny(sliding_window_pattern=3), device="meta").structure() != base


@pytest.mark.parametrize("dtype,hidden,scale", [(torch.float32, 64, 8.0), (torch.bfloat16, 3072, 55.5)])
def test_embedding_scale_is_rounded_to_the_model_dtype(dtype, hidden, scale):
    model = Gemma3Model(gemma3_tiny(hidden_size=hidden, num_hidden_layers=1), device="meta", dtype=dtype)
    assert model.embed_scale == scale
    assert math.isclose(scale, hidden**0.5, rel_tol=4e-3)


def test_norms_scale_by_one_plus_weight_and_head_is_tied():
    model = Gemma3Model(gemma3_tiny(), device="meta")
    norms = [m for m in model.modules() if hasattr(m, "unit_offset")]
    assert len(norms) == 6 * (4 + 2) + 1 and all(m.unit_offset for m in norms)
    assert not any("lm_head" in name for name in model.state_dict())


def test_final_logits_are_soft_capped():
    cap = 0.2
    uncapped = run_decode(build_random_model("gemma3", "tiny", seed=4), forced_tokens(4), backend="eager").logits
    capped = run_decode(
        build_random_model("gemma3", "tiny", seed=4, final_logit_softcapping=cap), forced_tokens(4), backend="eager"
    ).logits
    assert uncapped.abs().max() > cap
    assert capped.abs().max() <= cap
    torch.testing.assert_close(capped, cap * torch.tanh(uncapped / cap), rtol=0, atol=1e-6)


def test_layer_types_must_name_every_layer():
    with pytest.raises(ConfigError, match="layer_types"):
        gemma3_tiny(layer_types=(SLIDING, FULL))
