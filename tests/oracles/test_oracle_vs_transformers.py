"""vs_transformers: the decode path against its transformers twin, on the gate's own configs.

It passes on every family x KV layout on fx with the parity experiment (8-token
prompt + 24 tokens: every 8-position window is crossed), and fails under its
negative control, a RoPE frequency bug planted in code the decode path and the
family's own reference share, which ``vs_reference`` provably misses. Without
transformers it is skipped, with the reason, and a skip neither passes nor
fails the run.
"""
from __future__ import annotations

import dataclasses

import pytest

from conftest import default_or_slow
import torch

from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles import hf_twin
from fuelpipe.oracles.planted import planted
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.oracles.vs_transformers import layer_kinds
from fuelpipe.results import OK, status_of
from fuelpipe.rope import RopeSpec
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from fuelpipe.runner.table import verdict_of
from models.registry import build_config

pytest.importorskip("transformers", reason="the external reference: pip install -e '.[test]'")

GATE = [  # the default gate: every family x the KV layouts it supports
    ("llama_tiny", "contiguous"), ("llama_tiny", "paged"), ("phi_tiny", "contiguous"), ("phi_tiny", "paged"),
    ("qwen3_tiny", "contiguous"), ("qwen3_tiny", "paged"), ("gemma3_tiny", "contiguous"), ("gemma3_tiny", "paged"),
    ("deepseek_v2_tiny", "latent"),
]
FAMILIES = [(m, kv) for m, kv in GATE if kv != "paged"]


def _run(compose_cfg, model, kv, name, *extra):
    cfg = compose_cfg([f"model={model}", f"kv={kv}", "experiment=parity", "backend=fx", *extra])
    return run_one(cfg, assemble(cfg), ORACLES[name])


@pytest.mark.parametrize("model,kv", default_or_slow(GATE, [("gemma3_tiny", "contiguous"), ("qwen3_tiny", "paged")]))
def test_passes_on_the_gate_configs(compose_cfg, model, kv):
    result = _run(compose_cfg, model, kv, "vs_transformers")
    print(f"\n{model} {kv}: {result.seconds:.2f}s {result.metric}")
    assert result.passed and not result.skipped, result.detail
    assert result.metric["steps"] == 24 and result.tolerance == 1e-5


@pytest.mark.parametrize("model,kv", default_or_slow(FAMILIES, [("llama_tiny", "contiguous"), ("gemma3_tiny", "contiguous")]))
def test_negative_control_fails_where_vs_reference_passes(compose_cfg, model, kv):
    control = _run(compose_cfg, model, kv, "vs_transformers", "experiment.oracles.vs_transformers.inject_fault=true")
    assert control.negative_control and control.fault == Fault.ROPE_FREQ_EXPONENT.value
    assert not control.passed and not control.skipped and not control.detail.startswith("raised"), control.detail
    assert control.metric["max_abs_error"] > 10 * control.tolerance * control.metric["logit_scale"]

    # The planted bug is shared by the decode path and the family's own reference: vs_reference cannot see it.
    cfg = compose_cfg([f"model={model}", f"kv={kv}", "experiment=parity", "backend=fx"])
    with planted(Fault.ROPE_FREQ_EXPONENT):
        blind = run_one(cfg, assemble(cfg), ORACLES["vs_reference"])
    assert blind.passed, f"vs_reference was expected to miss the shared RoPE bug: {blind.detail}"


def test_planted_fault_is_restored_and_changes_frequencies():
    spec = RopeSpec(10000.0, 16)
    right = spec.inv_freq()
    with planted(Fault.ROPE_FREQ_EXPONENT):
        wrong = spec.inv_freq()
    assert not torch.equal(right, wrong) and torch.equal(spec.inv_freq(), right)
    with planted(Fault.NAIVE_DCE):  # any other fault plants nothing shared
        assert torch.equal(spec.inv_freq(), right)


def test_skipped_without_transformers_is_neither_pass_nor_failure(compose_cfg, monkeypatch):
    def missing():
        raise ImportError("No module named 'transformers'")

    monkeypatch.setattr(hf_twin, "_transformers", missing)
    result = _run(compose_cfg, "llama_tiny", "contiguous", "vs_transformers")
    assert result.skipped and not result.passed and "not installed" in result.detail
    doc = result.to_json()
    assert doc["skipped"] is True and verdict_of(doc) == "SKIP"
    failed = dataclasses.replace(result, skipped=False, name="other").to_json()
    assert status_of([doc]) == OK and status_of([doc, failed]) != OK


def test_a_family_without_twin_is_named():
    assert "has no transformers twin" in hf_twin.unavailable_reason("mamba")
    with pytest.raises(hf_twin.TwinError, match="mamba"):
        hf_twin.hf_config("mamba", None)


class _Recorder:
    """A config stand-in that records which fields a twin builder reads (properties resolved through it)."""

    def __init__(self, config) -> None:
        self._config, self.read = config, set()

    def __getattr__(self, name):
        attr = getattr(type(self._config), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        self.read.add(name)
        return getattr(self._config, name)


@pytest.mark.parametrize("fam", sorted(hf_twin.twins()))
def test_twin_reads_every_config_field(fam):
    """A field the twin ignores would let a config value be wrong on both sides, or differ silently."""
    config = build_config(fam, "tiny")
    recorder = _Recorder(config)
    hf_twin.twins()[fam].config(recorder, hf_twin._transformers())
    assert {f.name for f in dataclasses.fields(config)} - recorder.read == set()


@pytest.mark.parametrize("model,kinds", [
    ("phi_tiny", {"sliding_attention"}), ("qwen3_tiny", {"full_attention", "sliding_attention"}),
    ("gemma3_tiny", {"full_attention", "sliding_attention"}),
])
def test_gate_configs_cross_every_window_with_each_layer_kind(compose_cfg, model, kinds):
    cfg = compose_cfg([f"model={model}", "experiment=parity"])
    config = build_config(cfg.model.family, cfg.model.size)
    twin = hf_twin.hf_config(cfg.model.family, config)
    assert set(layer_kinds(twin)) == kinds
    positions = len(cfg.experiment.prompts[0]) + cfg.experiment.new_tokens
    assert positions > 3 * twin.sliding_window  # several window boundaries crossed


def test_a_config_the_twin_cannot_express_is_skipped_with_the_reason(compose_cfg, monkeypatch):
    def inexpressible(theta, scaling=None, **extra):
        raise hf_twin.TwinError("RoPE scaling kind 'yarn' has no transformers rope_type mapping")

    import models.llama.twin  # the family's own twin (models/llama/twin.py) writes the RoPE entry

    monkeypatch.setattr(models.llama.twin, "rope_parameters", inexpressible)
    result = _run(compose_cfg, "llama_tiny", "contiguous", "vs_transformers")
    assert result.skipped and not result.passed and "no faithful transformers twin" in result.detail


# ---- RoPE scalings no gate model uses: compared with transformers' tables at the model's width ----------------

@pytest.mark.parametrize("theta,rotary_dim", [(10000.0, 16), (1e6, 64), (500000.0, 8)])
def test_every_scaling_kind_equals_transformers_tables(theta, rotary_dim):
    from fuelpipe.oracles.rope_twin import compare_scalings

    results = compare_scalings(theta, rotary_dim)
    assert {r.name.split()[0] for r in results} == {"linear", "llama3", "yarn"}
    assert all(r.ok for r in results), [r.seen() for r in results if not r.ok]


@pytest.mark.parametrize("bug", ["yarn_attention_factor_dropped", "llama3_band_swapped", "yarn_ramp_reversed"])
def test_a_scaling_bug_fails_the_rope_comparison(monkeypatch, bug):
    """Three different bugs in scaling code no tiny config reaches: each fails the comparison."""
    import fuelpipe.rope as rope
    from fuelpipe.oracles.rope_twin import compare_scalings

    if bug == "yarn_attention_factor_dropped":
        monkeypatch.setattr(rope.RopeScaling, "cos_sin_factor", lambda self: 1.0)
    elif bug == "llama3_band_swapped":
        monkeypatch.setattr(rope, "_llama3_scale", lambda inv, s: torch.where(2 * torch.pi / inv > s.original_max_position_embeddings / s.high_freq_factor, inv / s.factor, inv))
    else:
        original = rope._yarn_scale
        monkeypatch.setattr(rope, "_yarn_scale", lambda theta, dim, s: original(theta, dim, s).flip(0))
    bad = [r for r in compare_scalings(10000.0, 16) if not r.ok]
    assert bad, f"{bug} passed the RoPE comparison"


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_the_twin_of_a_float32_model_shares_its_weights_instead_of_copying_them(family):
    """On a real checkpoint a copied twin doubles the memory of the check; a shared one costs nothing. A bfloat16
    model's twin computes in float32, so there the weights are upcast copies."""
    from models.registry import build_random_model

    model = build_random_model(family, "tiny", seed=3)
    hf = hf_twin.twin_of(model)
    ours = {t.data_ptr() for t in model.state_dict().values()}
    theirs = [p for p in hf.parameters()]
    assert theirs and all(p.data_ptr() in ours for p in theirs)
    if hf_twin._tied_head(hf):
        assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    half = build_random_model(family, "tiny", seed=3, dtype=torch.bfloat16)
    upcast = hf_twin.twin_of(half)
    assert all(p.dtype == torch.float32 for p in upcast.parameters())
    assert not {p.data_ptr() for p in upcast.parameters()} & {t.data_ptr() for t in half.state_dict().values()}
