"""Helpers for the weights tests: locating shipped checkpoints, writing tiny synthetic GGUF files."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import gguf
import numpy as np
import pytest
import torch

from fuelpipe.weights.errors import ModelPackageMissingError
from fuelpipe.weights.named import named_path


def real_gguf_path(name: str) -> Path:
    """The shipped checkpoint's file, or skip the test (naming the pip command) when its package is absent."""
    try:
        return named_path(name)
    except ModelPackageMissingError as e:
        pytest.skip(str(e))


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (bytes that print as themselves keep their character)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What convert_hf_to_gguf does to Llama q/k rows (pairs each head's halves for interleaved RoPE)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_gguf_tensors(model) -> dict[str, np.ndarray]:
    """A fuelpipe Llama's weights under llama.cpp's names and layouts (q/k permuted), f32."""
    c = model.config
    sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}  # copies: callers may edit
    out = {"token_embd.weight": sd["embed_tokens.weight"], "output_norm.weight": sd["norm.weight"]}
    if not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        for ours, theirs in names.items():
            out[f"blk.{i}.{theirs}.weight"] = sd[p + ours + ".weight"]
        out[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
    return out


def write_llama_gguf(
    path: Path, model, *, tensors: Optional[dict[str, np.ndarray]] = None, arch: str = "llama",
    raw_types: Optional[dict[str, object]] = None, edit_meta: Optional[Callable] = None,
) -> Path:
    """Write ``model`` (a fuelpipe Llama) as a GGUF file with gguf.GGUFWriter, plus a byte-level tokenizer.

    ``tensors`` replaces the tensor set (to drop or reshape one), ``raw_types`` stores named tensors as raw
    bytes of another GGML type, ``edit_meta(writer)`` adds metadata.
    """
    c = model.config

    def meta(w):
        _common_meta(w, c)
        w.add_rope_dimension_count(c.resolved_head_dim)
        _rope_scaling_meta(w, c)
        if edit_meta is not None:
            edit_meta(w)

    return _write(path, arch, c.vocab_size, meta, tensors if tensors is not None else llama_gguf_tensors(model),
                  raw_types)


def gemma3_gguf_tensors(model, norm_offset: float = 1.0) -> dict[str, np.ndarray]:
    """A fuelpipe Gemma3's weights under llama.cpp's names; norms stored as (norm_offset + w), as its converter does."""
    sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}  # copies: callers may edit
    out = {"token_embd.weight": sd["embed_tokens.weight"], "output_norm.weight": sd["norm.weight"] + norm_offset}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(model.config.num_hidden_layers):
        for ours, theirs in names.items():
            w = sd[f"layers.{i}.{ours}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = w + norm_offset if "norm" in ours else w
    return out


def write_gemma3_gguf(path: Path, model, *, tensors: Optional[dict[str, np.ndarray]] = None) -> Path:
    """Write a fuelpipe Gemma3 as a GGUF file the way llama.cpp's converter lays out gemma3."""
    c = model.config

    def meta(w):
        _common_meta(w, c)
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        w.add_sliding_window(c.sliding_window)
        _rope_scaling_meta(w, c)

    return _write(path, "gemma3", c.vocab_size, meta, tensors if tensors is not None else gemma3_gguf_tensors(model))


def _rope_scaling_meta(w, c) -> None:
    """Linear scaling, the one kind GGUF metadata carries here; anything else cannot be written faithfully."""
    if c.rope_scaling.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c.rope_scaling.factor)
    elif c.rope_scaling.kind != "none":
        raise ValueError(f"a GGUF file cannot carry rope scaling {c.rope_scaling.kind!r}")


def _common_meta(w, c) -> None:
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_theta)


def _write(path: Path, arch: str, vocab_size: int, meta: Callable, tensors: dict[str, np.ndarray],
           raw_types: Optional[dict[str, object]] = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    meta(w)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    tokens = byte_level_alphabet()[: vocab_size - 2] + ["ab", "abc"]  # two merges, so the list is not empty
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab_size)
    w.add_token_merges(["a b", "ab c"])
    w.add_add_bos_token(False)
    for name, arr in tensors.items():
        if raw_types and name in raw_types:
            w.add_tensor(name, arr, raw_dtype=raw_types[name])
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def torch_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def llama_hf_config(model) -> dict:
    """A transformers-style config.json dict for a fuelpipe Llama (written by hand: no transformers needed)."""
    c = model.config
    return {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings}


def llama_hf_tensors(model) -> dict[str, torch.Tensor]:
    """A fuelpipe Llama's weights under HF checkpoint names (``model.`` prefix; the head unprefixed)."""
    return {(k if k == "lm_head.weight" else f"model.{k}"): v.detach().clone().contiguous()
            for k, v in model.state_dict().items()}


def write_llama_hf_dir(path: Path, model, *, tensors: Optional[dict[str, torch.Tensor]] = None,
                       config: Optional[dict] = None) -> Path:
    """Write ``model`` (a fuelpipe Llama) as an HF directory: config.json + model.safetensors."""
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config if config is not None else llama_hf_config(model)))
    save_file(tensors if tensors is not None else llama_hf_tensors(model), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path
