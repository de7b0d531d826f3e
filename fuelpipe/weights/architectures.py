"""What each checkpoint architecture means for a registered family, as data.

One ``Architecture`` per checkpoint architecture says:

* which registry family builds it,
* how to turn the checkpoint's own config (GGUF metadata, HF ``config.json``)
  into the family's config fields,
* for GGUF, how llama.cpp's tensor names map onto the family's parameter
  names and which tensors llama.cpp stored transformed.

HF safetensors need no name table: the families' parameter names follow the
HF checkpoints (``model.`` prefix aside), so only the config translation is
per architecture.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from fuelpipe.masks import FULL, SLIDING
from fuelpipe.rope import RopeScaling
from fuelpipe.weights.errors import CheckpointConfigError

Transform = Callable[[torch.Tensor, Any], torch.Tensor]  # (f32 tensor, family config) -> tensor


@dataclass(frozen=True)
class TensorRule:
    """``source`` (checkpoint name) -> ``target`` (parameter name); ``{i}`` stands for the layer index."""

    source: str
    target: str
    transform: Optional[Transform] = None


@dataclass(frozen=True)
class Architecture:
    family: str
    gguf_arch: Optional[str]  # general.architecture, None if GGUF files of it are not loaded
    hf_architectures: tuple[str, ...]
    config_from_gguf: Optional[Callable[["GgufConfigReader"], dict]]
    config_from_hf: Callable[["HfConfigReader"], dict]
    gguf_tensors: tuple[TensorRule, ...] = ()


# ---- reading checkpoint configs ----------------------------------------------------------
class GgufConfigReader:
    """``{arch}.*`` metadata of one GGUF file; a missing required key names the file and the key."""

    def __init__(self, path: Path, arch: str, metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]):
        self.path, self.arch, self.metadata, self.tensor_shapes = path, arch, metadata, tensor_shapes

    def req(self, key: str) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.metadata:
            raise CheckpointConfigError(self.path, f"GGUF metadata key {full!r} is missing")
        return self.metadata[full]

    def opt(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes

    def rows(self, name: str) -> int:
        if name not in self.tensor_shapes:
            raise CheckpointConfigError(self.path, f"tensor {name!r} is missing, so its size cannot be read")
        return self.tensor_shapes[name][0]

    def rope_scaling(self) -> RopeScaling:
        kind = self.opt("rope.scaling.type", "none")
        if kind == "none":
            return RopeScaling()
        if kind == "linear":
            return RopeScaling("linear", float(self.req("rope.scaling.factor")))
        raise CheckpointConfigError(
            self.path, f"GGUF rope scaling type {kind!r} ({self.arch}.rope.scaling.type) is not supported; "
            "supported: none, linear"
        )


class HfConfigReader:
    """A ``config.json`` dict; a missing required key names the file and the key."""

    def __init__(self, path: Path, cfg: dict[str, Any]):
        self.path, self.cfg = path, cfg

    def req(self, key: str) -> Any:
        if self.cfg.get(key) is None:
            raise CheckpointConfigError(self.path, f"config.json has no {key!r}")
        return self.cfg[key]

    def opt(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def rope(self, default_theta: float = 10000.0) -> tuple[float, RopeScaling]:
        """(rope_theta, scaling) from either the transformers-4 keys or transformers-5 ``rope_parameters``."""
        params = self.cfg.get("rope_parameters") or {}
        scaling = self.cfg.get("rope_scaling") or params
        theta = self.opt("rope_theta", params.get("rope_theta", default_theta))
        kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        if kind == "default":
            return float(theta), RopeScaling()
        if kind == "linear":
            return float(theta), RopeScaling("linear", float(scaling["factor"]))
        if kind == "llama3":
            return float(theta), RopeScaling(
                "llama3", float(scaling["factor"]), float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]),
            )
        raise CheckpointConfigError(
            self.path, f"rope scaling type {kind!r} is not supported; supported: default, linear, llama3"
        )

    def require_activation(self, key: str, allowed: tuple[str, ...]) -> None:
        act = self.opt(key, allowed[0])
        if act not in allowed:
            raise CheckpointConfigError(self.path, f"config.json {key}={act!r} is not supported; expected one of {allowed}")


# ---- transforms --------------------------------------------------------------------------
def _unpermute(n_heads: int, w: torch.Tensor) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation for its interleaved RoPE.

    convert_hf_to_gguf stores, within each head, rows ``[r0, r_half, r1, r_half+1, ...]``
    (``reshape(H, 2, D/2, ...).swapaxes(1, 2)``); this restores ``[r0 .. r_{D-1}]``.
    """
    rest = w.shape[1:]
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def unpermute_q(w: torch.Tensor, c) -> torch.Tensor:
    return _unpermute(c.num_attention_heads, w)


def unpermute_k(w: torch.Tensor, c) -> torch.Tensor:
    return _unpermute(c.num_key_value_heads, w)


def minus_one(w: torch.Tensor, c) -> torch.Tensor:
    """llama.cpp stores Gemma norm weights as (1 + w) so its runtime can scale by the stored value;
    fuelpipe's unit-offset RMSNorm wants w back."""
    return w - 1.0


# ---- Llama -------------------------------------------------------------------------------
def _llama_gguf_config(m: GgufConfigReader) -> dict:
    heads = int(m.req("attention.head_count"))
    hidden = int(m.req("embedding_length"))
    key_length = m.opt("attention.key_length")
    head_dim = int(key_length) if key_length is not None else hidden // heads
    rotary = int(m.opt("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise CheckpointConfigError(
            m.path, f"{m.arch}.rope.dimension_count={rotary} differs from head_dim {head_dim}; "
            "the llama family rotates whole heads"
        )
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=int(m.req("feed_forward_length")),
        num_hidden_layers=int(m.req("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(m.opt("attention.head_count_kv", heads)),
        head_dim=None if key_length is None else head_dim,
        rms_norm_eps=float(m.req("attention.layer_norm_rms_epsilon")),
        rope_theta=float(m.opt("rope.freq_base", 10000.0)),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=int(m.req("context_length")),
        tie_word_embeddings=not m.has_tensor("output.weight"),
        attention_bias=m.has_tensor("blk.0.attn_q.bias"),
        mlp_bias=m.has_tensor("blk.0.ffn_up.bias"),
    )


def _llama_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    heads = int(h.req("num_attention_heads"))
    return dict(
        vocab_size=int(h.req("vocab_size")),
        hidden_size=int(h.req("hidden_size")),
        intermediate_size=int(h.req("intermediate_size")),
        num_hidden_layers=int(h.req("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(h.opt("num_key_value_heads", heads)),
        head_dim=h.opt("head_dim"),
        rms_norm_eps=float(h.opt("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(h.opt("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(h.opt("tie_word_embeddings", False)),
        attention_bias=bool(h.opt("attention_bias", False)),
        mlp_bias=bool(h.opt("mlp_bias", False)),
    )


def _linear(src: str, dst: str, transform: Optional[Transform] = None) -> tuple[TensorRule, ...]:
    return (TensorRule(f"{src}.weight", f"{dst}.weight", transform), TensorRule(f"{src}.bias", f"{dst}.bias", transform))


_LLAMA_GGUF = (
    TensorRule("token_embd.weight", "embed_tokens.weight"),
    TensorRule("output_norm.weight", "norm.weight"),
    TensorRule("output.weight", "lm_head.weight"),
    TensorRule("blk.{i}.attn_norm.weight", "layers.{i}.input_layernorm.weight"),
    *_linear("blk.{i}.attn_q", "layers.{i}.self_attn.q_proj", unpermute_q),
    *_linear("blk.{i}.attn_k", "layers.{i}.self_attn.k_proj", unpermute_k),
    *_linear("blk.{i}.attn_v", "layers.{i}.self_attn.v_proj"),
    *_linear("blk.{i}.attn_output", "layers.{i}.self_attn.o_proj"),
    TensorRule("blk.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    *_linear("blk.{i}.ffn_gate", "layers.{i}.mlp.gate_proj"),
    *_linear("blk.{i}.ffn_up", "layers.{i}.mlp.up_proj"),
    *_linear("blk.{i}.ffn_down", "layers.{i}.mlp.down_proj"),
)

# ---- Gemma 3 (text) ----------------------------------------------------------------------
# Older gemma3 files do not store these two; llama.cpp then uses these values.
GEMMA3_SLIDING_PATTERN = 6  # every 6th layer global
GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # RoPE base of the sliding layers
GEMMA3_27B_LAYERS = 62  # llama.cpp scales 27B queries by (hidden / heads), every other size by head_dim


def _gemma3_gguf_config(m: GgufConfigReader) -> dict:
    key_length, value_length = int(m.req("attention.key_length")), int(m.opt("attention.value_length", 0))
    if value_length and value_length != key_length:
        raise CheckpointConfigError(m.path, f"{m.arch}.attention.value_length {value_length} differs from "
                                            f"key_length {key_length}")
    heads, hidden, layers = int(m.req("attention.head_count")), int(m.req("embedding_length")), int(m.req("block_count"))
    softcap = m.opt("final_logit_softcapping")
    if m.opt("attn_logit_softcapping") is not None:
        raise CheckpointConfigError(m.path, f"{m.arch}.attn_logit_softcapping is not supported by the gemma3 family")
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=int(m.req("feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(m.opt("attention.head_count_kv", heads)),
        head_dim=key_length,
        query_pre_attn_scalar=hidden / heads if layers == GEMMA3_27B_LAYERS else key_length,
        rms_norm_eps=float(m.req("attention.layer_norm_rms_epsilon")),
        rope_theta=float(m.opt("rope.freq_base", 1_000_000.0)),
        rope_local_base_freq=float(m.opt("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=int(m.req("context_length")),
        sliding_window=int(m.req("attention.sliding_window")),
        **_gemma3_gguf_layer_kinds(m, layers),
        final_logit_softcapping=None if softcap is None else float(softcap),
    )


def _gemma3_gguf_layer_kinds(m: GgufConfigReader, layers: int) -> dict:
    """``attention.sliding_window_pattern``: a period, or one bool per layer (true: sliding)."""
    pattern = m.opt("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, int):
        return dict(sliding_window_pattern=pattern)
    if len(pattern) != layers:
        raise CheckpointConfigError(m.path, f"{m.arch}.attention.sliding_window_pattern has {len(pattern)} "
                                            f"entries for {layers} layers")
    return dict(layer_types=tuple(SLIDING if bool(s) else FULL for s in pattern))


def _gemma3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_activation", ("gelu_pytorch_tanh",))
    if h.opt("attn_logit_softcapping") is not None:
        raise CheckpointConfigError(h.path, "config.json attn_logit_softcapping is not supported by the gemma3 family")
    if not h.opt("tie_word_embeddings", True):
        raise CheckpointConfigError(h.path, "config.json unties the head; the gemma3 family always ties it")
    params = h.cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE entry per layer kind
        theta, scaling = HfConfigReader(h.path, {"rope_parameters": params["full_attention"]}).rope()
        local_theta, local_scaling = HfConfigReader(h.path, {"rope_parameters": params["sliding_attention"]}).rope()
        if local_scaling.kind != "none":
            raise CheckpointConfigError(h.path, "RoPE scaling on sliding layers is not supported by the gemma3 family")
    else:
        theta, scaling = h.rope(default_theta=1_000_000.0)
        local_theta = float(h.opt("rope_local_base_freq", 10_000.0))
    heads = int(h.req("num_attention_heads"))
    layer_types = h.opt("layer_types")
    return dict(
        vocab_size=int(h.req("vocab_size")),
        hidden_size=int(h.req("hidden_size")),
        intermediate_size=int(h.req("intermediate_size")),
        num_hidden_layers=int(h.req("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(h.opt("num_key_value_heads", heads)),
        head_dim=int(h.opt("head_dim", 256)),
        query_pre_attn_scalar=float(h.opt("query_pre_attn_scalar", 256)),
        rms_norm_eps=float(h.opt("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_local_base_freq=local_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(h.opt("max_position_embeddings", 131072)),
        sliding_window=int(h.opt("sliding_window", 4096)),
        sliding_window_pattern=int(h.opt("sliding_window_pattern", h.opt("_sliding_window_pattern", 6))),
        layer_types=tuple(layer_types) if layer_types is not None else None,
        final_logit_softcapping=h.opt("final_logit_softcapping"),
    )


_GEMMA3_GGUF = (
    TensorRule("token_embd.weight", "embed_tokens.weight"),
    TensorRule("output_norm.weight", "norm.weight", minus_one),
    TensorRule("blk.{i}.attn_norm.weight", "layers.{i}.input_layernorm.weight", minus_one),
    TensorRule("blk.{i}.attn_q.weight", "layers.{i}.self_attn.q_proj.weight"),
    TensorRule("blk.{i}.attn_k.weight", "layers.{i}.self_attn.k_proj.weight"),
    TensorRule("blk.{i}.attn_v.weight", "layers.{i}.self_attn.v_proj.weight"),
    TensorRule("blk.{i}.attn_output.weight", "layers.{i}.self_attn.o_proj.weight"),
    TensorRule("blk.{i}.attn_q_norm.weight", "layers.{i}.self_attn.q_norm.weight", minus_one),
    TensorRule("blk.{i}.attn_k_norm.weight", "layers.{i}.self_attn.k_norm.weight", minus_one),
    TensorRule("blk.{i}.post_attention_norm.weight", "layers.{i}.post_attention_layernorm.weight", minus_one),
    TensorRule("blk.{i}.ffn_norm.weight", "layers.{i}.pre_feedforward_layernorm.weight", minus_one),
    TensorRule("blk.{i}.post_ffw_norm.weight", "layers.{i}.post_feedforward_layernorm.weight", minus_one),
    TensorRule("blk.{i}.ffn_gate.weight", "layers.{i}.mlp.gate_proj.weight"),
    TensorRule("blk.{i}.ffn_up.weight", "layers.{i}.mlp.up_proj.weight"),
    TensorRule("blk.{i}.ffn_down.weight", "layers.{i}.mlp.down_proj.weight"),
)


# ---- Qwen3 and Phi-3 (HF directories) -------------------------------------------------------
def _qwen3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    heads = int(h.req("num_attention_heads"))
    layer_types = h.opt("layer_types")
    return dict(
        vocab_size=int(h.req("vocab_size")),
        hidden_size=int(h.req("hidden_size")),
        intermediate_size=int(h.req("intermediate_size")),
        num_hidden_layers=int(h.req("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(h.opt("num_key_value_heads", heads)),
        head_dim=int(h.opt("head_dim", int(h.req("hidden_size")) // heads)),
        rms_norm_eps=float(h.opt("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(h.opt("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(h.opt("tie_word_embeddings", False)),
        attention_bias=bool(h.opt("attention_bias", False)),
        use_sliding_window=bool(h.opt("use_sliding_window", False)),
        sliding_window=h.opt("sliding_window"),
        max_window_layers=int(h.opt("max_window_layers", int(h.req("num_hidden_layers")))),
        layer_types=tuple(layer_types) if layer_types is not None else None,
    )


def _phi3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    if scaling.kind != "none":
        raise CheckpointConfigError(h.path, f"RoPE scaling {scaling.kind!r} is not supported by the phi family")
    params = h.cfg.get("rope_parameters") or {}
    heads = int(h.req("num_attention_heads"))
    return dict(
        vocab_size=int(h.req("vocab_size")),
        hidden_size=int(h.req("hidden_size")),
        intermediate_size=int(h.req("intermediate_size")),
        num_hidden_layers=int(h.req("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(h.opt("num_key_value_heads", heads)),
        rms_norm_eps=float(h.opt("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        partial_rotary_factor=float(h.opt("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))),
        max_position_embeddings=int(h.opt("max_position_embeddings", 4096)),
        sliding_window=h.opt("sliding_window"),
        tie_word_embeddings=bool(h.opt("tie_word_embeddings", False)),
    )


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", "llama", ("LlamaForCausalLM",), _llama_gguf_config, _llama_hf_config, _LLAMA_GGUF),
    Architecture("gemma3", "gemma3", ("Gemma3ForCausalLM",), _gemma3_gguf_config, _gemma3_hf_config, _GEMMA3_GGUF),
    Architecture("qwen3", None, ("Qwen3ForCausalLM",), None, _qwen3_hf_config),
    Architecture("phi", None, ("Phi3ForCausalLM",), None, _phi3_hf_config),
)


def by_gguf_arch() -> dict[str, Architecture]:
    return {a.gguf_arch: a for a in ARCHITECTURES if a.gguf_arch}


def by_hf_architecture() -> dict[str, Architecture]:
    return {name: a for a in ARCHITECTURES for name in a.hf_architectures}
