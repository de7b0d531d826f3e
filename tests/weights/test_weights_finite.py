"""Non-finite weights are refused at load, naming the tensor, how many values and where the first one is."""
import numpy as np
import pytest
import torch

from fuelpipe.weights import load_model
from fuelpipe.weights.errors import NonFiniteWeightError, WeightsError
from models.registry import build_random_model
from _support.weights_helpers import llama_gguf_tensors, llama_hf_tensors, write_llama_gguf, write_llama_hf_dir


@pytest.fixture(scope="module")
def tiny():
    return build_random_model("llama", "tiny", seed=5)


def test_a_nan_in_a_gguf_weight_is_refused_by_name_count_and_index(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    tensors["blk.1.ffn_up.weight"][3, 7] = np.nan
    path = write_llama_gguf(tmp_path / "nan.gguf", tiny, tensors=tensors)
    with pytest.raises(NonFiniteWeightError) as info:
        load_model(path)
    err = info.value
    assert isinstance(err, WeightsError) and isinstance(err, ValueError)
    assert (err.tensor, err.count, err.first_index) == ("blk.1.ffn_up.weight", 1, (3, 7))
    assert str(path) in str(err) and "'blk.1.ffn_up.weight'" in str(err) and "1 non-finite value(s) of 8192" in str(err)
    assert "nan at index [3, 7]" in str(err)


def test_infinities_are_counted(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    tensors["output_norm.weight"][[5, 9, 60]] = [np.inf, -np.inf, np.inf]
    path = write_llama_gguf(tmp_path / "inf.gguf", tiny, tensors=tensors)
    with pytest.raises(NonFiniteWeightError, match=r"'output_norm.weight' holds 3 non-finite .* inf at index \[5\]"):
        load_model(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nan_in_an_hf_directory_is_refused(tiny, tmp_path, dtype):
    tensors = {k: v.to(dtype) for k, v in llama_hf_tensors(tiny).items()}
    tensors["model.layers.0.mlp.down_proj.weight"][10, 2] = float("nan")
    tensors["model.layers.0.mlp.down_proj.weight"][11, 0] = float("inf")
    path = write_llama_hf_dir(tmp_path / "hf", tiny, tensors=tensors)
    with pytest.raises(NonFiniteWeightError) as info:
        load_model(path)
    err = info.value
    assert (err.tensor, err.count, err.first_index) == ("model.layers.0.mlp.down_proj.weight", 2, (10, 2))
    assert "model.safetensors" in str(err)


def test_finite_weights_whose_sum_overflows_still_load(tiny, tmp_path):
    """The fast check sums each tensor; an overflowing sum of finite values must not be mistaken for a NaN."""
    tensors = llama_hf_tensors(tiny)
    tensors["model.norm.weight"][:4] = 3e38  # finite, but the sum is inf
    model, _, _ = load_model(write_llama_hf_dir(tmp_path / "hf", tiny, tensors=tensors))
    assert torch.isfinite(model.norm.weight).all() and model.norm.weight[0] == 3e38


def test_the_check_is_reported_in_the_load_timings(tiny, tmp_path):
    _, _, report = load_model(write_llama_gguf(tmp_path / "ok.gguf", tiny))
    assert report.timings_s["finite_check"] >= 0.0 and "finite_check" in report.summary()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_fast_sum_never_misses_and_never_false_alarms(dtype):
    from fuelpipe.weights.finite import check_finite

    big = torch.full((64,), torch.finfo(dtype).max / 2, dtype=dtype)  # finite, the sum overflows
    check_finite("f", "big", big)
    for poison in (float("nan"), float("inf"), -float("inf")):
        t = big.clone()
        t[40] = poison
        with pytest.raises(NonFiniteWeightError, match=r"'t' holds 1 non-finite .* at index \[40\]"):
            check_finite("f", "t", t)
    pair = torch.tensor([float("inf"), -float("inf")], dtype=dtype)  # sums to NaN: still two infinities
    with pytest.raises(NonFiniteWeightError, match="holds 2 non-finite"):
        check_finite("f", "pair", pair)
