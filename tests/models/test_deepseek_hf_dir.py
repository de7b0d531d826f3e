"""DeepSeek-V2 from an HF directory written by transformers: YaRN RoPE, per-expert tensors restacked at load.

Each directory is a tiny random ``DeepseekV2ForCausalLM`` saved by transformers itself (routed experts one
tensor per expert, YaRN in ``rope_parameters``); the loaded model decodes through its held plan and every
step is compared with transformers' uncached forward over the growing sequence. Negative controls: the same
directory with YaRN dropped (wholly, or only its mscale_all_dim) must miss transformers beyond tolerance.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers", reason="the external oracle: pip install -e '.[test]'")

from _support.family_helpers import PROMPT, forced_tokens, max_err, run_decode  # noqa: E402
from fuelpipe.errors import ConfigError  # noqa: E402
from fuelpipe.rope import RopeScaling, RopeSpec  # noqa: E402
from fuelpipe.weights import load_model  # noqa: E402
from fuelpipe.weights.errors import (  # noqa: E402
    CheckpointConfigError, MissingExpertError, NonFiniteWeightError, UnexpectedExpertError,
)
from _support.hf_helpers import build_pair, hf_logits_growing  # noqa: E402

TOL = 1e-4  # f32, as in test_hf_parity
STEPS = 12
# Original context 64 puts the 8-wide RoPE key's four frequencies on both sides of YaRN's ramp and inside it;
# mscale != mscale_all_dim makes both the cos/sin factor and the softmax factor differ from 1.
YARN = RopeScaling("yarn", 8.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
                   mscale=1.0, mscale_all_dim=0.707)
VARIANTS = {"q_lora": {}, "no_q_lora": {"q_lora_rank": None}}  # tiny: layer 1 has 4 routed experts (top-2)
LAYER, EXPERTS = 1, 4


@functools.lru_cache(maxsize=None)
def written(variant: str, family_name: str = "deepseek_v2"):
    """(fuelpipe model holding the twin's weights, transformers' logits at every step, forced tokens)."""
    ours, hf = build_pair(family_name, seed=21, rope_scaling=YARN, **VARIANTS[variant])
    tokens = forced_tokens(STEPS)
    want = hf_logits_growing(hf, list(PROMPT) + tokens, len(PROMPT))
    return ours, hf, want, tokens


def save(tmp_path: Path, variant: str = "q_lora", family_name: str = "deepseek_v2") -> Path:
    written(variant, family_name)[1].save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))


def edit_rope(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    rope = {k: v for k, v in {**cfg["rope_parameters"], **changes}.items() if v is not None}
    edit_config(path, rope_parameters=rope)


def edit_tensors(path: Path, edit) -> None:
    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    edit(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})


def expert(j: int, proj: str, layer: int = LAYER) -> str:
    return f"model.layers.{layer}.mlp.experts.{j}.{proj}.weight"


# ---- loads, and decodes like transformers ----------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_directory_loads_and_decodes_like_transformers(variant, tmp_path):
    ours, _, want, tokens = written(variant)
    stored = load_file(str(save(tmp_path, variant) / "model.safetensors"))
    assert expert(EXPERTS - 1, "gate_proj") in stored  # transformers wrote one tensor per expert
    model, tok, report = load_model(tmp_path)
    assert report.architecture == "DeepseekV2ForCausalLM" and tok is None
    assert model.config == ours.config and model.config.rope_scaling == YARN
    assert (model.config.q_lora_rank is None) == (variant == "no_q_lora")
    got, same = model.state_dict(), ours.state_dict()
    assert got.keys() == same.keys() and all(torch.equal(got[k], same[k]) for k in same)
    experts = model.layers[LAYER].mlp.experts
    assert experts.gate_up_proj.shape == (EXPERTS, 64, 64)  # [E, 2I, H]
    gate_up_2 = torch.cat((stored[expert(2, "gate_proj")], stored[expert(2, "up_proj")]))  # expert 2's rows
    assert torch.equal(experts.gate_up_proj[2], gate_up_2)
    assert torch.equal(experts.down_proj[3], stored[expert(3, "down_proj")])
    err = max_err(run_decode(model, tokens).logits, want)
    print(f"\n{variant}: max |fuelpipe - transformers| = {err:.3g} over {len(tokens) + 1} rows")
    assert err <= TOL


def test_bf16_load_converts_the_restacked_experts(tmp_path):
    ours, _, _, _ = written("q_lora")
    model, _, report = load_model(save(tmp_path), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert report.tensor_types == {"float32": len(load_file(str(tmp_path / "model.safetensors")))}
    assert torch.equal(model.layers[LAYER].mlp.experts.down_proj,
                       ours.layers[LAYER].mlp.experts.down_proj.to(torch.bfloat16))


def test_experts_already_stored_stacked_load_by_name(tmp_path):
    ours, _, _, _ = written("q_lora")

    def stack(t):
        gate_up = [torch.cat((t.pop(expert(j, "gate_proj")), t.pop(expert(j, "up_proj")))) for j in range(EXPERTS)]
        t[f"model.layers.{LAYER}.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        t[f"model.layers.{LAYER}.mlp.experts.down_proj"] = torch.stack([t.pop(expert(j, "down_proj"))
                                                                        for j in range(EXPERTS)])

    edit_tensors(save(tmp_path), stack)
    model, _, _ = load_model(tmp_path)
    got, same = model.state_dict(), ours.state_dict()
    assert all(torch.equal(got[k], same[k]) for k in same)


def test_yarn_on_a_llama_directory_matches_transformers(tmp_path):
    """The RoPE part is the framework's: a YaRN Llama (cos/sin factor, no softmax change) loads and matches too."""
    _, _, want, tokens = written("q_lora", "llama")
    model, _, _ = load_model(save(tmp_path, "q_lora", "llama"))
    assert model.config.rope_scaling == YARN
    assert max_err(run_decode(model, tokens).logits, want) <= TOL


# ---- negative controls: YaRN really matters ---------------------------------------------------
@pytest.mark.parametrize("drop", ["scaling", "mscale_all_dim", "attention_factor_forced_to_1"])
def test_dropping_yarn_misses_transformers(drop, tmp_path):
    _, _, want, tokens = written("q_lora")
    save(tmp_path)
    if drop == "scaling":
        edit_config(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    elif drop == "mscale_all_dim":  # changes the cos/sin factor and the softmax scale
        edit_rope(tmp_path, mscale_all_dim=None)
    else:  # frequencies and softmax scale right, cos/sin rows unscaled
        edit_rope(tmp_path, attention_factor=1.0)
    model, _, _ = load_model(tmp_path)
    err = max_err(run_decode(model, tokens).logits, want)
    print(f"\nwithout {drop}: max |fuelpipe - transformers| = {err:.3g}")
    assert err > TOL, f"dropping {drop} went unnoticed ({err:.3g} <= {TOL})"


# ---- refusals ----------------------------------------------------------------------------
def test_a_missing_expert_tensor_is_refused_naming_layer_and_expert(tmp_path):
    save(tmp_path)
    edit_tensors(tmp_path, lambda t: t.pop(expert(2, "up_proj")))
    with pytest.raises(MissingExpertError, match=r"layer 1, routed expert 2: missing tensor "
                                                 r"'model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight'") as info:
        load_model(tmp_path)
    assert (info.value.layer, info.value.expert) == (1, 2)


@pytest.mark.parametrize("layer,j,why", [(1, EXPERTS, "the model has 4 routed experts"),
                                         (0, 0, r"layer 0 is not an MoE layer here \(layers 1\.\.1 are")])
def test_an_extra_expert_tensor_is_refused_naming_layer_and_expert(layer, j, why, tmp_path):
    save(tmp_path)
    edit_tensors(tmp_path, lambda t: t.__setitem__(expert(j, "down_proj", layer), t[expert(0, "down_proj")].clone()))
    with pytest.raises(UnexpectedExpertError, match=f"layer {layer} holds routed expert {j}, but {why}") as info:
        load_model(tmp_path)
    assert (info.value.layer, info.value.expert) == (layer, j)


def test_a_non_finite_expert_is_refused_before_restacking(tmp_path):
    save(tmp_path)
    edit_tensors(tmp_path, lambda t: t[expert(3, "gate_proj")].__setitem__((5, 7), float("nan")))
    with pytest.raises(NonFiniteWeightError) as info:
        load_model(tmp_path)
    assert info.value.tensor == expert(3, "gate_proj") and info.value.first_index == (5, 7)


@pytest.mark.parametrize("change,match", [
    (dict(beta_slow=0), "0 < beta_slow <= beta_fast, got beta_slow=0.0"),
    (dict(beta_fast=0.5), "got beta_slow=1.0, beta_fast=0.5"),
    (dict(factor=0.5), "factor must be >= 1 .*got 0.5"),
    (dict(mscale=-1), "mscale must be >= 0 .*got -1.0"),
    (dict(attention_factor=0), "attention_factor must be a finite number > 0 or None, got 0.0"),
    (dict(original_max_position_embeddings=None), "no 'rope_parameters.original_max_position_embeddings'"),
    (dict(truncate="yes"), r"rope_parameters\.truncate='yes' must be true or false"),
])
def test_invalid_yarn_in_config_json_is_refused(change, match, tmp_path):
    edit_rope(save(tmp_path), **change)
    with pytest.raises(CheckpointConfigError, match=match):
        load_model(tmp_path)


@pytest.mark.parametrize("change,match", [
    (dict(topk_method="group_limited_greedy", n_group=2, topk_group=1), "topk_method='group_limited_greedy'"),
    (dict(norm_topk_prob=True), "norm_topk_prob=True"),
    (dict(scoring_func="sigmoid"), "scoring_func='sigmoid'"),
    (dict(moe_layer_freq=2), "moe_layer_freq=2"),
    (dict(num_key_value_heads=2), "num_key_value_heads=2"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "mscale_all_dim": 0.7}), "mscale_all_dim=0.7"),
])
def test_what_the_family_does_not_implement_is_refused(change, match, tmp_path):
    edit_config(save(tmp_path), **change)
    with pytest.raises(CheckpointConfigError, match=f"{match}.* not supported by the deepseek_v2 family"):
        load_model(tmp_path)


@pytest.mark.parametrize("fields,match", [
    (dict(kind="yarn", factor=40.0, beta_fast=float("inf")), "beta_fast must be finite, got inf"),
    (dict(kind="yarn", factor=4.0, original_max_position_embeddings=0),
     "original_max_position_embeddings must be >= 1, got 0"),
    (dict(kind="yarn", factor=4.0, mscale_all_dim=-0.1), "mscale_all_dim must be >= 0 .*got -0.1"),
    (dict(kind="yarn", factor=4.0, truncate=1), "truncate must be true or false, got 1"),
    (dict(kind="linear", factor=2.0, mscale=0.7), "kind 'linear' takes no YaRN fields, got mscale=0.7"),
    (dict(kind="nope"), "got 'nope'"),
])
def test_rope_scaling_refuses_bad_yarn_fields_by_value(fields, match):
    with pytest.raises(ConfigError, match=match):
        RopeScaling(**fields)


def test_yarn_keeps_fast_frequencies_interpolates_slow_ones_and_scales_rows():
    plain = RopeSpec(10000.0, 8).inv_freq()
    yarn = RopeSpec(10000.0, 8, YARN).inv_freq()
    assert yarn[0] == plain[0] and torch.allclose(yarn[2:], plain[2:] / YARN.factor)
    assert plain[1] / YARN.factor < yarn[1] < plain[1]  # on the ramp
    assert YARN.cos_sin_factor() == pytest.approx((1 + 0.1 * 1.0 * 2.0794415) / (1 + 0.1 * 0.707 * 2.0794415))
    assert RopeScaling("yarn", 8.0, original_max_position_embeddings=64).cos_sin_factor() == pytest.approx(1.20794415)


def test_the_checkpoint_module_imports_first_without_a_cycle():
    root = Path(__file__).resolve().parents[2]
    code = "import models.deepseek_v2.checkpoint as c; print(c.DEEPSEEK_V2_ARCHITECTURE.hf_architectures)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0 and "DeepseekV2ForCausalLM" in out.stdout, out.stderr


@pytest.mark.parametrize("backend", ["fx", pytest.param("aot", marks=pytest.mark.slow)])
def test_the_directory_passes_the_gate_through_the_config_path(compose_cfg, tmp_path, backend):
    """``model.weights=hf_dir``, as a user runs it: loads, and vs_transformers (YaRN + experts) and vs_reference pass.
    On fx in the default run; on aot (the shipped default backend: a cold build of every DeepSeek layer program,
    about 5 min on 2 cores) by hand (-m slow; CI's 90 minutes do not hold it)."""
    from fuelpipe.runner.job import run_job

    path = save(tmp_path)
    cfg = compose_cfg(["model.family=deepseek_v2", "model.weights=hf_dir", f"model.path={path}", "kv=latent",
                       f"backend={backend}", "experiment=smoke", "experiment.oracles.vs_transformers.enabled=true",
                       "experiment.oracles.vs_reference.enabled=true"], tiny=False)
    doc = run_job(cfg)
    assert doc["status"] == "ok", doc.get("reasons")
    assert doc["config"]["backend"]["name"] == backend
    verdicts = {o["name"]: o for o in doc["oracles"]}
    assert verdicts["vs_transformers"]["passed"] and not verdicts["vs_transformers"].get("skipped")
    assert verdicts["vs_reference"]["passed"]
    assert doc["model"]["architecture"] == "DeepseekV2ForCausalLM"
