"""HF-format directories (config.json + safetensors) for every registered family, written by transformers itself."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers", reason="the external oracle: pip install -e '.[test]'")

from fuelpipe.weights import load_model  # noqa: E402
from fuelpipe.weights.errors import CheckpointConfigError, CheckpointFormatError  # noqa: E402
from _support.hf_helpers import HF_TWINS, build_pair  # noqa: E402
from models.registry import families  # noqa: E402

IDS = torch.tensor([[3, 17, 42, 7, 99, 1, 250, 8, 8, 64, 5, 30]])  # longer than the tiny sliding windows


def save(hf, path, **kw):
    hf.save_pretrained(path, safe_serialization=True, **kw)
    return path


# Every family, DeepSeek-V2 included: its per-expert tensors are restacked at load (tests/models/test_deepseek_hf_dir.py).
HF_DIR_FAMILIES = sorted(families())


@pytest.mark.parametrize("family_name", HF_DIR_FAMILIES)
def test_every_family_loads_from_a_transformers_directory_exactly(family_name, tmp_path):
    ours, hf = build_pair(family_name, seed=11)
    model, tok, report = load_model(save(hf, tmp_path))
    assert type(model) is type(ours) and tok is None and report.format == "safetensors"
    assert report.architecture == HF_TWINS[family_name].architecture
    assert model.mask_plan == ours.mask_plan and model.rope_plan == ours.rope_plan
    got, want = model.state_dict(), ours.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert torch.equal(model.reference_logits(IDS), ours.reference_logits(IDS))


def test_tied_head_from_a_directory_without_lm_head(tmp_path):
    ours, hf = build_pair("llama", seed=12, tie_word_embeddings=True)
    model, _, _ = load_model(save(hf, tmp_path))
    assert model.lm_head.weight is model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, ours.lm_head.weight)


def test_sharded_directory(tmp_path):
    ours, hf = build_pair("qwen3", seed=13)
    save(hf, tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    model, _, _ = load_model(tmp_path)
    assert torch.equal(model.reference_logits(IDS), ours.reference_logits(IDS))


def test_bf16_checkpoint_into_f32_and_f32_into_bf16(tmp_path):
    ours, hf = build_pair("llama", seed=14)
    model, _, report = load_model(save(hf.to(torch.bfloat16), tmp_path / "bf16"))
    assert report.tensor_types == {"bfloat16": len(hf.state_dict())}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.equal(model.norm.weight, ours.norm.weight.to(torch.bfloat16).float())
    model16, _, _ = load_model(tmp_path / "bf16", dtype=torch.bfloat16)
    assert {p.dtype for p in model16.parameters()} == {torch.bfloat16}


def test_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    _, hf = build_pair("llama", seed=15)  # untied: lm_head differs from the embedding
    save(hf, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(CheckpointConfigError, match="'lm_head.weight' and 'model.embed_tokens.weight' both load the tied"):
        load_model(tmp_path)


def test_truncated_safetensors_is_refused(tmp_path):
    _, hf = build_pair("llama", seed=16)
    save(hf, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4096])
    with pytest.raises(CheckpointFormatError) as info:
        load_model(tmp_path)
    assert str(weights) in str(info.value)


def test_derived_rotary_buffers_in_old_checkpoints_are_skipped(tmp_path):
    ours, hf = build_pair("llama", seed=17)
    save(hf, tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    model, _, _ = load_model(tmp_path)
    assert torch.equal(model.reference_logits(IDS), ours.reference_logits(IDS))


def test_head_saved_instead_of_the_embedding_loads_a_family_without_lm_head(tmp_path):
    """A tied checkpoint may keep only ``lm_head.weight`` (safetensors' dedup picks one name); Gemma3 has no
    head of its own, so that tensor is its embedding."""
    ours, hf = build_pair("gemma3", seed=18)
    save(hf, tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    model, _, _ = load_model(tmp_path)
    assert torch.equal(model.reference_logits(IDS), ours.reference_logits(IDS))
