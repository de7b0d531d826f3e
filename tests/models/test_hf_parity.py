"""External oracle: every family against its transformers twin, logits compared at every decode step.

The twin (``hf_helpers``) is a transformers model built from the same config
with random weights, norm scales included, copied into the fuelpipe model by
checkpoint name. Each step is compared with an uncached full forward over the
growing sequence. Tiny configs use an 8-position window and 24 decode tokens,
so every window boundary is crossed. Negative controls: each corruption of
the decode-side data must make this oracle fail.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from _support.family_helpers import FAULT_CASES, FAULTS, PROMPT, forced_tokens, max_err, run_decode
from _support.hf_helpers import build_pair, hf_config, hf_logits_growing, load_from_hf
from models.registry import build_config, family

TOL = 1e-4  # f32
CASES = {
    "llama": ("llama", {}),
    "phi": ("phi", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),
    "gemma3-softcap": ("gemma3", {"final_logit_softcapping": 0.5}),
}


@functools.lru_cache(maxsize=None)
def expected(case: str):
    """(transformers model, the family's tiny config, its logits at every step)."""
    fam, overrides = CASES[case]
    model, hf = build_pair(fam, **overrides)
    tokens = forced_tokens()
    want = hf_logits_growing(hf, list(PROMPT) + tokens, len(PROMPT))
    return hf, model.config, tokens, want


def fresh_model(case: str):
    """A new fuelpipe model carrying the twin's weights (so a corruption never leaks between tests)."""
    hf, config, _, _ = expected(case)
    model = family(CASES[case][0]).model_cls(config)
    load_from_hf(model, hf)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers_at_every_step(case):
    _, _, tokens, want = expected(case)
    got = run_decode(fresh_model(case), tokens)
    errors = (got.logits - want).abs().amax(dim=-1)
    print(f"\n{case}: max |fuelpipe - transformers| = {errors.max().item():.3g} over {len(errors)} steps")
    assert errors.max().item() <= TOL, f"worst step {int(errors.argmax())}: {errors.max().item():.3g}"


@pytest.mark.parametrize("fam,fault", FAULT_CASES)
def test_transformers_oracle_catches_fault(fam, fault):
    _, _, tokens, want = expected(fam)
    model = fresh_model(fam)
    FAULTS[fault][0](model)
    err = max_err(run_decode(model, tokens).logits, want)
    print(f"\n{fam}/{fault}: max |fuelpipe - transformers| = {err:.3g}")
    assert err > TOL, f"{fault} went unnoticed by the transformers oracle ({err:.3g} <= {TOL})"


# ---- layer kinds: our derivation against transformers' own, from the same config inputs --------
KIND_CASES = [
    ("qwen3", dict(use_sliding_window=False, max_window_layers=1)),
    ("qwen3", dict(use_sliding_window=True, max_window_layers=0)),
    ("qwen3", dict(use_sliding_window=True, max_window_layers=3)),
    ("qwen3", dict(use_sliding_window=True, max_window_layers=9)),
    ("qwen3", dict(layer_types=("sliding_attention", "full_attention") * 2)),
    ("gemma3", dict(num_hidden_layers=12)),
    ("gemma3", dict(num_hidden_layers=7, sliding_window_pattern=3)),
    ("gemma3", dict(num_hidden_layers=4, sliding_window_pattern=1)),
]


@pytest.mark.parametrize("fam,overrides", KIND_CASES)
def test_layer_kinds_and_window_match_transformers(fam, overrides):
    config = build_config(fam, "tiny", **overrides)
    theirs = hf_config(fam, config)
    model = family(fam).model_cls(config, device="meta")
    assert model.mask_plan.layer_types == tuple(theirs.layer_types)
    if "sliding_attention" in theirs.layer_types:
        assert model.mask_plan.sliding_window == theirs.sliding_window


def test_transformers_is_imported_by_tests_only():
    """fuelpipe and models never import transformers, except the peers benchmarks (``bench_peers`` and
    ``bench_batch``), which time it as a peer, and the twin of the ``vs_transformers`` oracle (and its RoPE tables).

    There it is imported inside functions only, so fuelpipe imports and runs without it (the peer is then
    reported as not installed, the oracle as skipped).
    """
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in sorted([*root.glob("fuelpipe/**/*.py"), *root.glob("models/**/*.py")]):
        tree = ast.parse(path.read_text())
        lazy = path.is_relative_to(root / "fuelpipe/bench/peers") or path in (
            root / "fuelpipe/oracles/hf_twin.py", root / "fuelpipe/oracles/rope_twin.py",
            root / "fuelpipe/bench/batch_systems.py")
        nodes = [n for n in tree.body] if lazy else list(ast.walk(tree))  # lazy importers: module level only
        for node in nodes:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "transformers" or n.startswith("transformers.") for n in names):
                offenders.append(str(path.relative_to(root)))
    assert offenders == []
