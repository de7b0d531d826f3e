"""Hugging Face transformers twins of fuelpipe models: the external oracle (a test-only dependency).

For a fuelpipe config, ``hf_config`` writes the matching transformers config
from the config's *inputs* (window, ``max_window_layers``,
``sliding_window_pattern``, RoPE bases), so transformers derives each layer's
kind, window and RoPE base on its own; nothing is copied from the fuelpipe
model's ``mask_plan`` or ``rope_plan``. ``build_pair`` randomises the HF
model (norm scales included, so an ordering bug cannot hide behind ones or
zeros) and loads the same weights into the fuelpipe model by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import transformers

from fuelpipe.rope import RopeScaling
from models.registry import build_config, family

HF_COMMON = dict(attn_implementation="eager", pad_token_id=None, bos_token_id=1, eos_token_id=2)


def rope_parameters(theta: float, scaling: RopeScaling = RopeScaling(), **extra) -> dict:
    """A transformers ``rope_parameters`` entry for one RoPE spec."""
    if scaling.kind == "none":
        params = {"rope_type": "default"}
    elif scaling.kind == "linear":
        params = {"rope_type": "linear", "factor": scaling.factor}
    else:
        params = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return {**params, "rope_theta": theta, **extra}


def _geometry(c) -> dict:
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
    )


def _llama(c):
    return transformers.LlamaConfig(
        **_geometry(c), **HF_COMMON, head_dim=c.resolved_head_dim,
        rope_parameters=rope_parameters(c.rope_theta, c.rope_scaling),
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
    )


def _phi(c):
    return transformers.Phi3Config(
        **_geometry(c), **HF_COMMON,
        rope_parameters=rope_parameters(c.rope_theta, partial_rotary_factor=c.partial_rotary_factor),
        sliding_window=c.sliding_window, tie_word_embeddings=c.tie_word_embeddings,
    )


def _qwen3(c):
    return transformers.Qwen3Config(
        **_geometry(c), **HF_COMMON, head_dim=c.head_dim,
        rope_parameters=rope_parameters(c.rope_theta, c.rope_scaling),
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.attention_bias,
        use_sliding_window=c.use_sliding_window, sliding_window=c.sliding_window,
        max_window_layers=c.max_window_layers,
        layer_types=list(c.layer_types) if c.layer_types is not None else None,
    )


def _gemma3(c):
    return transformers.Gemma3TextConfig(
        **_geometry(c), **HF_COMMON, head_dim=c.head_dim, query_pre_attn_scalar=c.query_pre_attn_scalar,
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={
            "full_attention": rope_parameters(c.rope_theta, c.rope_scaling),
            "sliding_attention": rope_parameters(c.rope_local_base_freq),
        },
        sliding_window=c.sliding_window, sliding_window_pattern=c.sliding_window_pattern,
        layer_types=list(c.layer_types) if c.layer_types is not None else None,
        final_logit_softcapping=c.final_logit_softcapping, tie_word_embeddings=True,
    )


def _deepseek_v2(c):
    moe = c.n_routed_experts > 0
    cfg = transformers.DeepseekV2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_attention_heads, kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank,
        qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
        moe_intermediate_size=c.moe_intermediate_size or 1, n_routed_experts=c.n_routed_experts or 1,
        n_shared_experts=c.n_shared_experts or 1, num_experts_per_tok=c.num_experts_per_tok or 1,
        routed_scaling_factor=c.routed_scaling_factor, topk_method=c.topk_method,
        first_k_dense_replace=c.first_k_dense_replace if moe else c.num_hidden_layers,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        rope_parameters=rope_parameters(c.rope_theta), tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias,
    )
    cfg._attn_implementation = "eager"
    return cfg


@dataclass(frozen=True)
class HfTwin:
    config: Callable
    model_cls: Callable


HF_TWINS = {
    "llama": HfTwin(_llama, transformers.LlamaForCausalLM),
    "phi": HfTwin(_phi, transformers.Phi3ForCausalLM),
    "qwen3": HfTwin(_qwen3, transformers.Qwen3ForCausalLM),
    "gemma3": HfTwin(_gemma3, transformers.Gemma3ForCausalLM),
    "deepseek_v2": HfTwin(_deepseek_v2, transformers.DeepseekV2ForCausalLM),
}


def hf_config(family_name: str, config):
    """The transformers config matching a fuelpipe config."""
    return HF_TWINS[family_name].config(config)


def hf_model(family_name: str, config) -> torch.nn.Module:
    model = HF_TWINS[family_name].model_cls(hf_config(family_name, config)).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    return model


@torch.no_grad()
def randomize_hf(model: torch.nn.Module, seed: int, std: float = 0.05, norm_spread: float = 0.3) -> None:
    """Every parameter random. A 1-D weight is a norm scale here: it moves around its init (1, or 0 for (1 + w))."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if p.dim() == 1 and not name.endswith("bias"):
            p.add_(norm_spread * (torch.rand(p.shape, generator=gen) * 2 - 1))
        else:
            p.copy_(std * torch.randn(p.shape, generator=gen))


def load_from_hf(model: torch.nn.Module, hf: torch.nn.Module) -> None:
    """Copy weights by checkpoint name: ``model.X`` -> ``X``; a tied ``lm_head`` the family does not own is dropped."""
    ours = model.state_dict()
    mapped = {}
    for name, t in hf.state_dict().items():
        name = name.removeprefix("model.")
        if name == "lm_head.weight" and name not in ours:
            assert t.data_ptr() == hf.get_input_embeddings().weight.data_ptr(), "untied lm_head has nowhere to go"
            continue
        mapped[name] = t.clone()
    model.load_state_dict(mapped, strict=True)


def build_pair(family_name: str, seed: int = 0, **overrides):
    """(fuelpipe model, transformers model) of the family's ``tiny`` size with identical random weights."""
    config = build_config(family_name, "tiny", **overrides)
    hf = hf_model(family_name, config)
    randomize_hf(hf, seed)
    model = family(family_name).model_cls(config)
    load_from_hf(model, hf)
    return model, hf


@torch.no_grad()
def hf_logits_growing(hf: torch.nn.Module, seq: list[int], first: int) -> torch.Tensor:
    """Last-position logits of a full, uncached forward over seq[:n] for n = first .. len(seq): [steps, vocab] f32."""
    rows = [hf(input_ids=torch.tensor([seq[:n]]), use_cache=False).logits[0, -1].float() for n in range(first, len(seq) + 1)]
    return torch.stack(rows)
