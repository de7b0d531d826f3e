"""The public API refuses odd arguments with typed errors naming the value, never a bare torch/Python error."""
import numpy as np
import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError, InputError, KvCapacityError
from models.registry import build_config, build_random_model


@pytest.fixture(scope="module")
def ctx():
    return InferenceContext(build_random_model("llama", "tiny", seed=1), "eager")


@pytest.mark.parametrize("token, phrase", [
    (2**63, "token id 9223372036854775808 does not fit int64"),
    (-(2**63) - 1, "token id -9223372036854775809 does not fit int64"),
    (10**30, "does not fit int64"),
    (np.uint64(2**63), "token id 9223372036854775808 does not fit int64"),
    (-1, r"token ids must lie in \[0, 256\), got range \[-1, -1\]"),
    (2**63 - 1, r"token ids must lie in \[0, 256\), got range \[9223372036854775807"),
    (256, r"\[0, 256\), got range \[256, 256\]"),
    (np.int8(-1), r"\[0, 256\), got range \[-1, -1\]"),
    (True, "must be integers, got True"),
    (np.bool_(True), "must be integers"),
    (3.0, "must be integers, got float 3.0"),
    ("3", "must be integers, got str '3'"),
    (None, "must be integers, got NoneType None"),
    (torch.tensor(True), "decode takes one integer token id, got a torch.bool tensor"),
])
def test_decode_refuses_ids_outside_int64_or_the_vocabulary(ctx, token, phrase):
    cache = ctx.new_cache(16)
    with pytest.raises(InputError, match=phrase):
        ctx.decode(cache, token)
    assert cache.cached_len == 0


def test_decode_accepts_numpy_and_tensor_integers(ctx):
    cache = ctx.new_cache(16)
    for token in (np.int64(3), np.int16(4), torch.tensor(5), torch.tensor([6], dtype=torch.uint8)):
        ctx.decode(cache, token)
    assert cache.cached_len == 4


@pytest.mark.parametrize("prompt, phrase", [
    ([2**63], "does not fit int64"),
    (None, "prompt_ids must be a sequence of token ids, got NoneType None"),
    (5, "prompt_ids must be a sequence of token ids, got int 5"),
    ("abc", "prompt_ids must be a sequence of token ids, got str 'abc'"),
    ([1.5], "must be integers, got float 1.5"),
    (torch.tensor([1.0]), "must be integers, got dtype torch.float32"),
    ([1, 999], r"prompt token ids must lie in \[0, 256\), got \[999\]"),
])
def test_generate_refuses_bad_prompts(ctx, prompt, phrase):
    with pytest.raises(InputError, match=phrase):
        ctx.generate(prompt, 2)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(max_new_tokens=1.5), "max_new_tokens must be an integer, got float 1.5"),
    (dict(max_new_tokens=None), "max_new_tokens must be an integer, got NoneType None"),
    (dict(max_new_tokens=True), "max_new_tokens must be an integer, got bool True"),
    (dict(max_new_tokens="3"), "max_new_tokens must be an integer, got str '3'"),
    (dict(max_new_tokens=2, max_seq_len="8"), "max_seq_len must be an integer, got str '8'"),
    (dict(max_new_tokens=2, stop_ids=None), "stop_ids must be a sequence of token ids, got NoneType"),
    (dict(max_new_tokens=2, stop_ids=5), "stop_ids must be a sequence of token ids, got int 5"),
    (dict(max_new_tokens=2, sampler=None), "sampler must be callable, got NoneType"),
    (dict(max_new_tokens=2, on_token=3), "on_token must be callable, got int 3"),
    (dict(max_new_tokens=600), r"positions \[0, 601\) \(prompt 2 \+ max_new_tokens 600 - 1\) exceed the model's "
                               "max_position_embeddings 512"),
])
def test_generate_refuses_bad_arguments_before_running(ctx, kwargs, phrase):
    n = kwargs.pop("max_new_tokens")
    with pytest.raises(InputError, match=phrase):
        ctx.generate([1, 2], n, **kwargs)


def test_generate_refuses_a_pool_given_as_the_cache(ctx):
    with pytest.raises(InputError, match="cache must be a KV cache .* got KvBlockPool"):
        ctx.generate([1, 2], 2, cache=ctx.new_pool(4, 4))


@pytest.mark.parametrize("make, phrase", [
    (lambda c: c.new_cache(1.5), "max_seq_len must be an integer >= 1, got float 1.5"),
    (lambda c: c.new_cache(None), "max_seq_len must be an integer >= 1, got NoneType None"),
    (lambda c: c.new_cache("8"), "max_seq_len must be an integer >= 1, got str '8'"),
    (lambda c: c.new_cache(True), "max_seq_len must be an integer >= 1, got bool True"),
    (lambda c: c.new_cache(8, dtype="float"), "dtype must be a floating torch.dtype .* got 'float'"),
    (lambda c: c.new_cache(8, dtype=torch.int64), "dtype must be a floating torch.dtype .* got torch.int64"),
    (lambda c: c.new_pool(2.5, 4), "num_blocks must be an integer >= 2, got float 2.5"),
    (lambda c: c.new_pool(4, None), "block_size must be an integer >= 1, got NoneType None"),
    (lambda c: c.new_pool("4", 4), "num_blocks must be an integer >= 2, got str '4'"),
    (lambda c: c.new_pool(4, 4).sequence(2.5), "max_blocks_cap must be an integer >= 1, got float 2.5"),
    (lambda c: c.new_pool(4, 4).sequence(None), "max_blocks_cap must be an integer >= 1, got NoneType"),
])
def test_cache_sizes_and_dtypes_are_checked(ctx, make, phrase):
    with pytest.raises(KvCapacityError, match=phrase):
        make(ctx)


def test_a_misspelled_config_field_says_did_you_mean():
    with pytest.raises(ConfigError, match="unknown llama config field 'hiden_size'; did you mean 'hidden_size'?"):
        build_random_model("llama", "tiny", hiden_size=32)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(hidden_size="64"), "llama config field hidden_size must be int, got str '64'"),
    (dict(hidden_size=64.5), "hidden_size must be int, got float 64.5"),
    (dict(num_hidden_layers=True), "num_hidden_layers must be int, got bool True"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite float, got float nan"),
    (dict(head_dim="x"), "head_dim must be int or None, got str 'x'"),
    (dict(tie_word_embeddings=1), "tie_word_embeddings must be bool, got int 1"),
    (dict(rope_scaling={"kind": "linear"}), "rope_scaling must be RopeScaling, got dict"),
    (dict(seed="x"), "seed must be an integer, got str 'x'"),
    (dict(dtype="float32"), "dtype must be a floating torch.dtype"),
    (dict(dtype=torch.int64), "dtype must be a floating torch.dtype"),
    (dict(device="gpu"), "device 'gpu' is not a torch device"),
])
def test_wrong_typed_model_arguments_are_config_errors(kwargs, phrase):
    with pytest.raises(ConfigError, match=phrase):
        build_random_model("llama", "tiny", **kwargs)


def test_overrides_of_the_right_type_are_normalised():
    config = build_config("llama", "tiny", hidden_size=np.int64(32), rope_theta=5000)
    assert type(config.hidden_size) is int and config.hidden_size == 32 and type(config.rope_theta) is float
    qwen = build_config("qwen3", "tiny", num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"])
    assert qwen.layer_types == ("full_attention", "sliding_attention")


@pytest.mark.parametrize("family, size, phrase", [
    (None, "tiny", "a model family is named by a string, got NoneType None; available: deepseek_v2"),
    (3, "tiny", "a model family is named by a string, got int 3"),
    ("llama", None, "a llama size is named by a string, got NoneType None; available: smollm2_135m, tiny"),
    ("llamma", "tiny", "did you mean 'llama'"),
])
def test_family_and_size_names(family, size, phrase):
    with pytest.raises(ConfigError, match=phrase):
        build_config(family, size)
