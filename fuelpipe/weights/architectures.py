"""What each checkpoint architecture means for a registered family, as data.

One ``Architecture`` per checkpoint architecture says:

* which registry family builds it,
* how to turn the checkpoint's own config (GGUF metadata, HF ``config.json``)
  into the family's config fields,
* for GGUF, how llama.cpp's tensor names map onto the family's parameter
  names and which tensors llama.cpp stored transformed.

HF safetensors need no name table: the families' parameter names follow the
HF checkpoints (``model.`` prefix aside), so only the config translation is
per architecture, plus, where a checkpoint stores one parameter as several
tensors (DeepSeek-V2's per-expert weights), an ``hf_state_transform`` that
says how they combine.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from fuelpipe.masks import FULL, SLIDING
from fuelpipe.rope import YARN_DEFAULTS, RopeScaling
from fuelpipe.weights.errors import CheckpointConfigError

Transform = Callable[[torch.Tensor, Any], torch.Tensor]  # (f32 tensor, family config) -> tensor


@dataclass(frozen=True)
class TensorRule:
    """``source`` (checkpoint name) -> ``target`` (parameter name); ``{i}`` stands for the layer index."""

    source: str
    target: str
    transform: Optional[Transform] = None


@dataclass(frozen=True)
class Combined:
    """One parameter that an HF checkpoint stores as several tensors (DeepSeek-V2: one per routed expert).

    ``name`` is what the whole tensor would be called in the checkpoint (it resolves to the parameter like
    any other name); ``combine`` receives the ``sources`` in order, each read, finiteness-checked and still
    in its stored dtype, and returns a tensor of ``shape``, checked against the parameter before any read.
    """

    name: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    combine: Callable[[list[torch.Tensor]], torch.Tensor]


# (checkpoint directory, family config, checkpoint tensor name -> shape) -> the parameters stored in parts.
# Raises a WeightsError naming the tensor when the parts are incomplete or do not belong to the model.
HfStateTransform = Callable[[Path, Any, dict[str, tuple[int, ...]]], tuple[Combined, ...]]


@dataclass(frozen=True)
class Architecture:
    family: str
    gguf_arch: Optional[str]  # general.architecture, None if GGUF files of it are not loaded
    hf_architectures: tuple[str, ...]
    config_from_gguf: Optional[Callable[["GgufConfigReader"], dict]]
    config_from_hf: Callable[["HfConfigReader"], dict]
    gguf_tensors: tuple[TensorRule, ...] = ()
    hf_state_transform: Optional[HfStateTransform] = None  # None: every HF tensor is one parameter


# ---- reading checkpoint configs ----------------------------------------------------------
_MISSING = object()


class _TypedValues:
    """Typed reads on top of ``req``/``opt``: a value of the wrong type is refused, never coerced.

    ``int(64.5)`` would silently truncate and ``bool("false")`` is True; these name the key and the value.
    """

    path: Path

    def req(self, key: str) -> Any: ...  # supplied by the reader
    def opt(self, key: str, default: Any = None) -> Any: ...
    def key_name(self, key: str) -> str: ...

    def _get(self, key: str, default: Any) -> Any:
        return self.req(key) if default is _MISSING else self.opt(key, default)

    def _bad(self, key: str, value: Any, want: str) -> CheckpointConfigError:
        return CheckpointConfigError(self.path, f"{self.key_name(key)}={value!r} must be {want}")

    def int_(self, key: str, default: Any = _MISSING) -> Any:
        """An integer (an integral float such as 64.0 is accepted); ``default`` may be None."""
        value = self._get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
                not isinstance(value, numbers.Integral) and not float(value).is_integer()):
            raise self._bad(key, value, "an integer")
        return int(value)

    def float_(self, key: str, default: Any = _MISSING) -> Any:
        """A finite number; ``default`` may be None."""
        value = self._get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise self._bad(key, value, "a finite number")
        return float(value)

    def bool_(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value


class GgufConfigReader(_TypedValues):
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

    def key_name(self, key: str) -> str:
        return f"GGUF metadata {self.arch}.{key}"

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
            return RopeScaling("linear", self.float_("rope.scaling.factor"))
        raise CheckpointConfigError(
            self.path, f"GGUF rope scaling type {kind!r} ({self.arch}.rope.scaling.type) is not supported; "
            "supported: none, linear"
        )


class HfConfigReader(_TypedValues):
    """A ``config.json`` dict; a missing required key names the file and the key."""

    def __init__(self, path: Path, cfg: dict[str, Any], prefix: str = ""):
        if not isinstance(cfg, dict):
            raise CheckpointConfigError(path, f"config.json {prefix.rstrip('.') or 'top level'} must be an object, "
                                              f"got {type(cfg).__name__} {cfg!r}")
        self.path, self.cfg, self.prefix = path, cfg, prefix  # prefix: where a nested object sits ("rope_scaling.")

    def req(self, key: str) -> Any:
        if self.cfg.get(key) is None:
            raise CheckpointConfigError(self.path, f"config.json has no {self.prefix + key!r}")
        return self.cfg[key]

    def opt(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def key_name(self, key: str) -> str:
        return f"config.json {self.prefix}{key}"

    def rope(self, default_theta: float = 10000.0) -> tuple[float, RopeScaling]:
        """(rope_theta, scaling) from either the transformers-4 keys or transformers-5 ``rope_parameters``."""
        params = HfConfigReader(self.path, self.cfg.get("rope_parameters") or {}, "rope_parameters.")
        which = "rope_scaling" if self.cfg.get("rope_scaling") else "rope_parameters"
        scaling = HfConfigReader(self.path, self.cfg.get("rope_scaling") or params.cfg, which + ".")
        theta = self.float_("rope_theta", params.float_("rope_theta", default_theta))
        kind = scaling.opt("rope_type", scaling.opt("type", "default"))
        if kind == "default":
            return theta, RopeScaling()
        if kind == "linear":
            return theta, RopeScaling("linear", scaling.float_("factor"))
        if kind == "llama3":
            return theta, RopeScaling(
                "llama3", scaling.float_("factor"), scaling.float_("low_freq_factor"),
                scaling.float_("high_freq_factor"), scaling.int_("original_max_position_embeddings"),
            )
        if kind == "yarn":
            return theta, scaling.yarn(self.int_("max_position_embeddings", None))
        raise CheckpointConfigError(
            self.path, f"rope scaling type {kind!r} is not supported; supported: default, linear, llama3, yarn"
        )

    def yarn(self, max_position_embeddings: Optional[int]) -> RopeScaling:
        """A YaRN entry (this reader holds the scaling object). Absent or null fields take transformers' defaults;
        an absent factor is the context's stretch, max_position_embeddings / original_max_position_embeddings."""
        original = self.int_("original_max_position_embeddings")
        factor = self.float_("factor", None)
        if factor is None:
            if max_position_embeddings is None:
                raise CheckpointConfigError(self.path, f"{self.key_name('factor')} is missing and there is no "
                                                       "max_position_embeddings to derive it from")
            factor = max_position_embeddings / original
        d = YARN_DEFAULTS
        return RopeScaling(
            "yarn", factor, original_max_position_embeddings=original,
            beta_fast=self.float_("beta_fast", d["beta_fast"]), beta_slow=self.float_("beta_slow", d["beta_slow"]),
            mscale=self.float_("mscale", d["mscale"]),
            mscale_all_dim=self.float_("mscale_all_dim", d["mscale_all_dim"]),
            attention_factor=self.float_("attention_factor", None), truncate=self.bool_("truncate", d["truncate"]),
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
    heads = m.int_("attention.head_count")
    hidden = m.int_("embedding_length")
    key_length = m.int_("attention.key_length", None)
    head_dim = key_length if key_length is not None else hidden // heads
    rotary = m.int_("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise CheckpointConfigError(
            m.path, f"{m.arch}.rope.dimension_count={rotary} differs from head_dim {head_dim}; "
            "the llama family rotates whole heads"
        )
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=m.int_("feed_forward_length"),
        num_hidden_layers=m.int_("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=m.int_("attention.head_count_kv", heads),
        head_dim=None if key_length is None else head_dim,
        rms_norm_eps=m.float_("attention.layer_norm_rms_epsilon"),
        rope_theta=m.float_("rope.freq_base", 10000.0),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=m.int_("context_length"),
        tie_word_embeddings=not m.has_tensor("output.weight"),
        attention_bias=m.has_tensor("blk.0.attn_q.bias"),
        mlp_bias=m.has_tensor("blk.0.ffn_up.bias"),
    )


def _llama_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    heads = h.int_("num_attention_heads")
    return dict(
        vocab_size=h.int_("vocab_size"),
        hidden_size=h.int_("hidden_size"),
        intermediate_size=h.int_("intermediate_size"),
        num_hidden_layers=h.int_("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=h.int_("num_key_value_heads", heads),
        head_dim=h.int_("head_dim", None),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 2048),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
        attention_bias=h.bool_("attention_bias", False),
        mlp_bias=h.bool_("mlp_bias", False),
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
    key_length, value_length = m.int_("attention.key_length"), m.int_("attention.value_length", 0)
    if value_length and value_length != key_length:
        raise CheckpointConfigError(m.path, f"{m.arch}.attention.value_length {value_length} differs from "
                                            f"key_length {key_length}")
    heads, hidden, layers = m.int_("attention.head_count"), m.int_("embedding_length"), m.int_("block_count")
    softcap = m.float_("final_logit_softcapping", None)
    if m.opt("attn_logit_softcapping") is not None:
        raise CheckpointConfigError(m.path, f"{m.arch}.attn_logit_softcapping is not supported by the gemma3 family")
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=m.int_("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=m.int_("attention.head_count_kv", heads),
        head_dim=key_length,
        query_pre_attn_scalar=hidden / heads if layers == GEMMA3_27B_LAYERS else key_length,
        rms_norm_eps=m.float_("attention.layer_norm_rms_epsilon"),
        rope_theta=m.float_("rope.freq_base", 1_000_000.0),
        rope_local_base_freq=m.float_("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=m.int_("context_length"),
        sliding_window=m.int_("attention.sliding_window"),
        **_gemma3_gguf_layer_kinds(m, layers),
        final_logit_softcapping=softcap,
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
        local_theta = h.float_("rope_local_base_freq", 10_000.0)
    heads = h.int_("num_attention_heads")
    layer_types = h.opt("layer_types")
    return dict(
        vocab_size=h.int_("vocab_size"),
        hidden_size=h.int_("hidden_size"),
        intermediate_size=h.int_("intermediate_size"),
        num_hidden_layers=h.int_("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=h.int_("num_key_value_heads", heads),
        head_dim=h.int_("head_dim", 256),
        query_pre_attn_scalar=h.float_("query_pre_attn_scalar", 256),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_local_base_freq=local_theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 131072),
        sliding_window=h.int_("sliding_window", 4096),
        sliding_window_pattern=h.int_("sliding_window_pattern", h.int_("_sliding_window_pattern", 6)),
        layer_types=tuple(layer_types) if layer_types is not None else None,
        final_logit_softcapping=h.float_("final_logit_softcapping", None),
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
    heads = h.int_("num_attention_heads")
    layer_types = h.opt("layer_types")
    return dict(
        vocab_size=h.int_("vocab_size"),
        hidden_size=h.int_("hidden_size"),
        intermediate_size=h.int_("intermediate_size"),
        num_hidden_layers=h.int_("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=h.int_("num_key_value_heads", heads),
        head_dim=h.int_("head_dim", h.int_("hidden_size") // heads),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 32768),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
        attention_bias=h.bool_("attention_bias", False),
        use_sliding_window=h.bool_("use_sliding_window", False),
        sliding_window=h.int_("sliding_window", None),
        max_window_layers=h.int_("max_window_layers", h.int_("num_hidden_layers")),
        layer_types=tuple(layer_types) if layer_types is not None else None,
    )


def _phi3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    if scaling.kind != "none":
        raise CheckpointConfigError(h.path, f"RoPE scaling {scaling.kind!r} is not supported by the phi family")
    params = h.cfg.get("rope_parameters") or {}
    heads = h.int_("num_attention_heads")
    return dict(
        vocab_size=h.int_("vocab_size"),
        hidden_size=h.int_("hidden_size"),
        intermediate_size=h.int_("intermediate_size"),
        num_hidden_layers=h.int_("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=h.int_("num_key_value_heads", heads),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-5),
        rope_theta=theta,
        partial_rotary_factor=h.float_("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)),
        max_position_embeddings=h.int_("max_position_embeddings", 4096),
        sliding_window=h.int_("sliding_window", None),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
    )


# The built-in families' architectures; each family lists its own in its ``FamilyEntry.architectures``.
LLAMA_ARCHITECTURE = Architecture("llama", "llama", ("LlamaForCausalLM",), _llama_gguf_config, _llama_hf_config,
                                  _LLAMA_GGUF)
GEMMA3_ARCHITECTURE = Architecture("gemma3", "gemma3", ("Gemma3ForCausalLM",), _gemma3_gguf_config,
                                   _gemma3_hf_config, _GEMMA3_GGUF)
QWEN3_ARCHITECTURE = Architecture("qwen3", None, ("Qwen3ForCausalLM",), None, _qwen3_hf_config)
PHI3_ARCHITECTURE = Architecture("phi", None, ("Phi3ForCausalLM",), None, _phi3_hf_config)


def registered_architectures() -> tuple[Architecture, ...]:
    """Every registered family's checkpoint architectures (built-in and installed)."""
    from models.registry import families

    return tuple(a for entry in families().values() for a in entry.architectures)


def by_gguf_arch() -> dict[str, Architecture]:
    return _unique("GGUF architecture", [(a.gguf_arch, a) for a in registered_architectures() if a.gguf_arch])


def by_hf_architecture() -> dict[str, Architecture]:
    return _unique("HF architecture", [(n, a) for a in registered_architectures() for n in a.hf_architectures])


def _unique(kind: str, pairs: list[tuple[str, Architecture]]) -> dict[str, Architecture]:
    """name -> architecture; two families claiming one checkpoint architecture is a typed clash."""
    from fuelpipe.registry import RegistrationClashError

    out: dict[str, Architecture] = {}
    for name, arch in pairs:
        if name in out and out[name] is not arch:
            raise RegistrationClashError(
                f"{kind} {name!r} is claimed by two families: {out[name].family!r} and {arch.family!r}")
        out[name] = arch
    return out
