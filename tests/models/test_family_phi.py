"""Phi (Phi-3 architecture): partial rotary, fused projections, window on every layer."""
from __future__ import annotations

import pytest

from fuelpipe.errors import ConfigError
from fuelpipe.masks import FULL, SLIDING
from models.phi import PhiConfig, PhiModel, phi_tiny


def test_rotated_width_follows_partial_rotary_factor():
    for factor, width in ((1.0, 16), (0.5, 8), (0.75, 12), (0.25, 4)):
        model = PhiModel(phi_tiny(partial_rotary_factor=factor), device="meta")
        assert model.config.rotary_dim == model.rope_plan.rotary_dim == width


@pytest.mark.parametrize("factor", [0.0, 1.5, 0.1875])  # 0.1875 * 16 = 3: odd
def test_bad_partial_rotary_factor_is_refused(factor):
    with pytest.raises(ConfigError, match="partial_rotary_factor|rotary width"):
        phi_tiny(partial_rotary_factor=factor)


def test_window_covers_every_layer_or_none():
    assert PhiModel(phi_tiny(), device="meta").mask_plan.layer_types == (SLIDING,) * 3
    unwindowed = PhiModel(phi_tiny(sliding_window=None), device="meta").mask_plan
    assert unwindowed.layer_types == (FULL,) * 3 and unwindowed.sliding_window is None


def test_checkpoint_names_are_the_fused_ones():
    names = set(PhiModel(phi_tiny(), device="meta").state_dict())
    assert {"layers.0.self_attn.qkv_proj.weight", "layers.0.mlp.gate_up_proj.weight"} <= names
    assert not {"layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"} & names


def test_rope_base_is_per_token_data_but_rotated_width_is_structure():
    base = PhiModel(phi_tiny(), device="meta").structure()
    assert PhiModel(phi_tiny(rope_theta=5e5), device="meta").structure() == base
    assert PhiModel(phi_tiny(partial_rotary_factor=1.0), device="meta").structure() != base


def test_head_dim_must_divide():
    with pytest.raises(ConfigError, match="hidden_size"):
        PhiConfig(vocab_size=8, hidden_size=30, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2)
