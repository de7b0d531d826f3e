"""validate(): the reasons a combination cannot run, named with the key and the value."""
from __future__ import annotations

import pytest
import torch

from fuelpipe.config.validate import validate
from fuelpipe.oracles.registry import ORACLES


def test_every_shipped_default_combination_is_valid(compose_cfg):
    assert validate(compose_cfg()) == []


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["kv=latent"], ["kv=latent needs an MLA model family; model.family=llama is not MLA"]),
        (["model=deepseek_v2_tiny"], [
            "kv=contiguous cannot serve the MLA family deepseek_v2: it decodes from kv=latent "
            "(an expanded cache would give up MLA's memory saving)",
        ]),
        (["model=deepseek_v2_tiny", "kv=paged"], [
            "kv=paged cannot serve the MLA family deepseek_v2: it decodes from kv=latent "
            "(an expanded cache would give up MLA's memory saving)",
        ]),
        (["kv=paged", "kv.num_blocks=2"], [
            "kv.num_blocks=2 is too small: one request of 26 positions needs 2 blocks of 16 plus the null block",
        ]),
        (["kv.num_blocks=8"], ["kv.num_blocks=8 applies to kv=paged only, not kv=contiguous"]),
        (["kv.max_seq_len=600"], [
            "kv.max_seq_len=600 exceeds the model's max_position_embeddings=512 (llama tiny)",
        ]),
        (["kv.max_seq_len=10"], [
            "kv.max_seq_len=10 is smaller than the 26 positions the experiment writes (longest prompt + decode tokens)",
        ]),
        (["model.family=lama"], ["unknown model.family 'lama'; did you mean 'llama'? available: deepseek_v2, gemma3, llama, phi, qwen3"]),
        (["model.size=tinny"], [
            "unknown model.size for family 'llama' 'tinny'; did you mean 'tiny'? available: smollm2_135m, tiny",
        ]),
        (["+model.overrides.num_hiden_layers=1"], [
            "unknown model.overrides key for llama 'num_hiden_layers'; did you mean 'num_hidden_layers'? "
            "available: attention_bias, head_dim, hidden_size, intermediate_size, max_position_embeddings, "
            "mlp_bias, num_attention_heads, num_hidden_layers, num_key_value_heads, rms_norm_eps, rope_scaling, "
            "rope_theta, tie_word_embeddings, vocab_size",
        ]),
        (["+model.overrides.num_key_value_heads=3"], [
            "model.overrides={'num_key_value_heads': 3}: LlamaConfig: num_attention_heads (4) must be a multiple of "
            "num_key_value_heads (3)",
        ]),
        (["model.weights=gguf", "model.path=/x.gguf"], [
            "model.path='/x.gguf': no such GGUF file",
        ]),
        (["model.dtype=bfloat16", "~experiment.oracles.vs_reference.tolerance.bfloat16"], [
            "experiment.oracles.vs_reference.tolerance has no entry for model.dtype=bfloat16",
        ]),
        (["+experiment.oracles.plan_vs_replan.tolerance.float32=0.1"], [
            "experiment.oracles.plan_vs_replan.tolerance must be empty: plan_vs_replan is bit-exact",
        ]),
        (["experiment.prompts=[[1,2,300]]"], [
            "request_isolation needs two prompts in experiment.prompts",
            "experiment.prompts hold token ids [300] outside the vocabulary [0, 256)",
        ]),
        (["experiment.new_tokens=2"], [
            "experiment.new_tokens must be >= 4 (the prefill's token, the build token and two reused ones), got 2",
        ]),
        (["experiment=bench", "experiment.bench.enabled=false"], [
            "the experiment runs nothing: every oracle, the benchmark and every stage are disabled",
        ]),
        (["backend.fx_passes=[fuse_sibling_linear]"], [
            "unknown backend.fx_passes entry 'fuse_sibling_linear'; did you mean 'fuse_sibling_linears'? "
            "available: chain_linears_on_model_weights, eliminate_dead_code_keeping_writes, fuse_sibling_linears, "
            "measured_linears, measured_linears_allowing_copies, pack_linears_into_panels, "
            "run_linears_on_model_weights, slot_attention_kernel, split_linears_across_threads, "
            "transpose_linears_for_gemm",  # negative-control passes not offered
        ]),
        (["batch.max_batch=0"], ["batch.max_batch must be an integer >= 1, got 0"]),
        (["batch.buckets=[1,2,4]"], [
            "batch.buckets [1, 2, 4] cannot serve batch.max_batch=8: the largest bucket must be >= max_batch "
            "(a full batch needs a plan)",
        ]),
        (["batch.buckets=[4,0,8]"], ["batch.buckets must be integers >= 1, got [0] in [4, 0, 8]"]),
        (["batch.buckets=[2,2,8]"], ["batch.buckets must not repeat a size, got [2, 2, 8]"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and "=" in v[0] else None,
)
def test_invalid_combinations_name_their_reasons(compose_cfg, overrides, expected):
    assert validate(compose_cfg(overrides)) == expected


def test_a_misspelled_oracle_in_a_preset_is_named(compose_cfg, tmp_path):
    """A user's own preset (found through hydra.searchpath) that names an oracle the registry lacks."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text(
        "# @package _global_\nexperiment:\n  name: typo\n  oracles:\n    vs_referense: {enabled: false}\n"
    )
    cfg = compose_cfg([f"hydra.searchpath=[file://{tmp_path}]", "experiment=typo"])
    assert validate(cfg) == [
        "unknown oracle in experiment.oracles 'vs_referense'; did you mean 'vs_reference'? "
        f"available: {', '.join(sorted(ORACLES))}"  # every registered oracle, in name order
    ]


def test_captured_plan_and_cuda_device_need_cuda(compose_cfg):
    reasons = validate(compose_cfg(["plan=captured", "backend.device=cuda"]))
    if torch.cuda.is_available():
        assert reasons == ["plan=captured is not implemented yet (CUDA graph capture is not built; see docs/limits.md); use plan=plan_once"]
    else:
        assert reasons == [
            "backend.device=cuda but torch.cuda.is_available() is False",
            "plan=captured needs CUDA (graph capture), but torch.cuda.is_available() is False",
        ]
