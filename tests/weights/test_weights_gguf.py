"""GGUF loading on small synthetic files written with gguf.GGUFWriter: exact round trips and the reader."""
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from fuelpipe.weights import load_model
from fuelpipe.weights.gguf_file import GgufFile
from models.registry import build_random_model
from _support.weights_helpers import gemma3_gguf_tensors, llama_gguf_tensors, write_gemma3_gguf, write_llama_gguf


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request):
    return build_random_model("llama", "tiny", seed=3, tie_word_embeddings=request.param)


def test_round_trip_is_exact_and_undoes_the_qk_permutation(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "tiny.gguf", tiny)
    model, tok, report = load_model(path)
    eps_as_stored = float(np.float32(tiny.config.rms_norm_eps))  # GGUF keeps the epsilon as f32
    assert type(model) is type(tiny) and model.config == replace(tiny.config, rms_norm_eps=eps_as_stored)
    got, want = model.state_dict(), tiny.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    ids = torch.tensor([[3, 17, 42, 7]])
    assert torch.equal(model.reference_logits(ids), tiny.reference_logits(ids))
    assert report.format == "gguf" and report.tensor_types == {"F32": len(llama_gguf_tensors(tiny))}


def test_negative_control_without_the_unpermute_q_would_differ(tiny, tmp_path):
    """The round trip above is only meaningful if the permutation moves rows: store q un-permuted and it fails."""
    tensors = llama_gguf_tensors(tiny)
    tensors["blk.0.attn_q.weight"] = tiny.state_dict()["layers.0.self_attn.q_proj.weight"].numpy()
    model, _, _ = load_model(write_llama_gguf(tmp_path / "plain_q.gguf", tiny, tensors=tensors))
    assert not torch.equal(model.layers[0].self_attn.q_proj.weight, tiny.layers[0].self_attn.q_proj.weight)


def test_tied_head_stays_one_parameter_and_nothing_is_left_on_meta(tiny, tmp_path):
    model, _, report = load_model(write_llama_gguf(tmp_path / "t.gguf", tiny))
    assert all(not p.is_meta for p in model.parameters())
    assert (model.lm_head.weight is model.embed_tokens.weight) == tiny.config.tie_word_embeddings
    assert report.n_params == sum(p.numel() for p in tiny.parameters())


def test_dtype_conversion_bf16(tiny, tmp_path):
    model, _, report = load_model(write_llama_gguf(tmp_path / "t.gguf", tiny), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.norm.weight, tiny.norm.weight.to(torch.bfloat16))
    assert report.weights_mb == pytest.approx(sum(p.numel() for p in model.parameters()) * 2 / 2**20)


def test_reader_agrees_with_gguf_reader(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "t.gguf", tiny, edit_meta=lambda w: w.add_array("test.floats", [0.5, 1.5]))
    ours, ref = GgufFile(path), gguf.GGUFReader(path)
    assert set(ours.metadata) | {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"} == set(ref.fields)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.asarray(want))
        else:
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape)) and info.ggml_type == int(t.tensor_type)
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes
        np.testing.assert_array_equal(ours.raw(info), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_gemma3_round_trip_subtracts_the_stored_norm_offset(tmp_path):
    """llama.cpp stores Gemma norms as (1 + w); the family's RMSNorm wants w. Local/global layers, the
    local RoPE base and the query scale are not in the file: llama.cpp's values (pattern 6, 10000,
    head_dim) are what the tiny config is given here, so the config must round-trip exactly."""
    tiny = build_random_model("gemma3", "tiny", seed=7, query_pre_attn_scalar=16)
    model, _, _ = load_model(write_gemma3_gguf(tmp_path / "g.gguf", tiny))
    eps_as_stored = float(np.float32(tiny.config.rms_norm_eps))
    assert model.config == replace(tiny.config, rms_norm_eps=eps_as_stored)
    assert model.mask_plan == tiny.mask_plan and model.rope_plan == tiny.rope_plan
    for name, want in tiny.state_dict().items():
        # (1 + w) - 1 rounds at f32's resolution near 1 (2**-23); every other tensor is bit-exact.
        atol = 2.0**-23 if "norm" in name else 0.0
        torch.testing.assert_close(model.state_dict()[name], want, atol=atol, rtol=0, msg=name)
    ids = torch.tensor([[3, 17, 42, 7, 99, 1, 250, 8, 8, 64, 5, 30]])
    torch.testing.assert_close(model.reference_logits(ids), tiny.reference_logits(ids), atol=1e-5, rtol=0)


def test_negative_control_gemma3_norms_stored_without_the_offset_load_wrong(tmp_path):
    tiny = build_random_model("gemma3", "tiny", seed=7, query_pre_attn_scalar=16)
    plain = write_gemma3_gguf(tmp_path / "plain.gguf", tiny, tensors=gemma3_gguf_tensors(tiny, norm_offset=0.0))
    model, _, _ = load_model(plain)
    torch.testing.assert_close(model.norm.weight, tiny.norm.weight - 1.0, atol=2.0**-23, rtol=0)
