"""Qwen3: per-head q/k norm, and the config's choice of sliding-window layers."""
from __future__ import annotations

import pytest
import torch

from _support.family_helpers import forced_tokens, max_err, reference_rows, run_decode
from fuelpipe.errors import ConfigError
from fuelpipe.masks import FULL, SLIDING
from models.qwen3 import Qwen3Model, qwen3_tiny
from models.registry import build_random_model


def kinds(**overrides):
    return Qwen3Model(qwen3_tiny(**overrides), device="meta").mask_plan


def test_window_layers_start_at_max_window_layers():
    plan = kinds()
    assert plan.layer_types == (FULL, FULL, SLIDING, SLIDING) and plan.sliding_window == 8
    assert kinds(max_window_layers=0).layer_types == (SLIDING,) * 4


def test_window_is_dead_unless_use_sliding_window():
    plan = kinds(use_sliding_window=False, max_window_layers=0)
    assert plan.layer_types == (FULL,) * 4 and plan.sliding_window is None


def test_explicit_layer_types_win_and_need_a_live_window():
    plan = kinds(layer_types=[SLIDING, FULL, SLIDING, FULL])  # a YAML list
    assert plan.layer_types == (SLIDING, FULL, SLIDING, FULL)
    with pytest.raises(ConfigError, match="use_sliding_window"):
        qwen3_tiny(use_sliding_window=False, layer_types=(SLIDING, FULL, FULL, FULL))
    with pytest.raises(ConfigError, match="layer_types"):
        qwen3_tiny(layer_types=(FULL,) * 3)


def test_q_and_k_are_rms_normed_per_head():
    """Scaling q's and k's projections is invisible behind their per-head RMS norms (up to eps); scaling v's is not.

    (Norm-then-RoPE order is pinned by the transformers oracle, where the norm weights are random.)
    """
    model = build_random_model("qwen3", "tiny", seed=2)
    tokens = forced_tokens(6)
    before = run_decode(model, tokens, backend="eager").logits

    def scaled(proj: str) -> torch.Tensor:
        with torch.no_grad():
            for layer in model.layers:
                getattr(layer.self_attn, proj).weight.mul_(3.0)
        out = run_decode(model, tokens, backend="eager")
        assert max_err(out.logits, reference_rows(model, out)) <= 1e-5
        return out.logits

    assert max_err(scaled("q_proj"), before) <= 5e-5  # eps alone moves it (measured ~5e-6)
    assert max_err(scaled("k_proj"), before) <= 5e-5
    assert max_err(scaled("v_proj"), before) > 1e-2
