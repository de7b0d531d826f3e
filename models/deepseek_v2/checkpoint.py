"""DeepSeek-V2 HF checkpoints: config.json translation and per-expert tensors restacked into the model's.

A DeepSeek-V2 directory stores each routed expert's projections as their own
tensors, ``model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight``;
the model holds them stacked per layer: ``experts.gate_up_proj`` [E, 2I, H]
(expert j's gate rows, then its up rows) and ``experts.down_proj`` [E, H, I].
What the model does not implement (group-limited routing, renormalised top-k
weights, sigmoid scoring, MoE on every n-th layer only) is refused by name,
never approximated.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from fuelpipe.weights.architectures import Architecture, Combined
from fuelpipe.weights.config_readers import HfConfigReader
from fuelpipe.weights.errors import CheckpointConfigError, MissingExpertError, TensorShapeError, UnexpectedExpertError
from models.deepseek_v2.config import DeepseekV2Config

HF_ARCHITECTURE = "DeepseekV2ForCausalLM"
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
_EXPERT_TENSOR = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


# ---- config.json -> DeepseekV2Config fields ----------------------------------------------
def _refuse(h: HfConfigReader, key: str, value, why: str) -> CheckpointConfigError:
    return CheckpointConfigError(h.path, f"config.json {key}={value!r} is not supported by the deepseek_v2 family: "
                                         f"{why}")


def deepseek_v2_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    heads = h.int_("num_attention_heads")
    kv_heads = h.int_("num_key_value_heads", heads)
    if kv_heads != heads:
        raise _refuse(h, "num_key_value_heads", kv_heads, f"MLA expands keys to every head ({heads})")
    if h.bool_("mlp_bias", False):
        raise _refuse(h, "mlp_bias", True, "its MLPs have no bias")
    theta, scaling = h.rope()
    raw_rope = h.cfg.get("rope_scaling") or h.cfg.get("rope_parameters") or {}
    if scaling.kind != "yarn" and isinstance(raw_rope, dict) and raw_rope.get("mscale_all_dim"):
        # transformers would scale the softmax by it under any scaled RoPE; only YaRN's is implemented
        raise _refuse(h, "rope mscale_all_dim", raw_rope["mscale_all_dim"], f"it applies with yarn only, "
                                                                           f"not {scaling.kind!r} scaling")
    fields = dict(
        vocab_size=h.int_("vocab_size"),
        hidden_size=h.int_("hidden_size"),
        intermediate_size=h.int_("intermediate_size"),
        num_hidden_layers=h.int_("num_hidden_layers"),
        num_attention_heads=heads,
        kv_lora_rank=h.int_("kv_lora_rank"),
        q_lora_rank=h.int_("q_lora_rank", None),  # null: queries are one full-rank projection
        qk_nope_head_dim=h.int_("qk_nope_head_dim"),
        qk_rope_head_dim=h.int_("qk_rope_head_dim"),
        v_head_dim=h.int_("v_head_dim"),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 2048),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
        attention_bias=h.bool_("attention_bias", False),
    )
    return {**fields, **_moe_fields(h)}


def _moe_fields(h: HfConfigReader) -> dict:
    """Routed-expert fields; n_group/topk_group only matter to group-limited routing, which is refused."""
    n_routed = h.int_("n_routed_experts", 0)  # null or 0: every layer dense
    if not n_routed:
        return {}
    method = h.opt("topk_method", "greedy")
    if method != "greedy":
        raise _refuse(h, "topk_method", method, "only greedy top-k routing is implemented")
    if h.bool_("norm_topk_prob", False):
        raise _refuse(h, "norm_topk_prob", True, "top-k weights are used as scored, never renormalised")
    scoring = h.opt("scoring_func", "softmax")
    if scoring != "softmax":
        raise _refuse(h, "scoring_func", scoring, "routing scores are a softmax")
    freq = h.int_("moe_layer_freq", 1)
    if freq != 1:
        raise _refuse(h, "moe_layer_freq", freq, "every layer from first_k_dense_replace on is MoE")
    return dict(
        n_routed_experts=n_routed,
        n_shared_experts=h.int_("n_shared_experts", 0),
        num_experts_per_tok=h.int_("num_experts_per_tok"),
        moe_intermediate_size=h.int_("moe_intermediate_size"),
        routed_scaling_factor=h.float_("routed_scaling_factor", 1.0),
        first_k_dense_replace=h.int_("first_k_dense_replace", 0),
        topk_method=method,
    )


# ---- per-expert tensors -> stacked parameters --------------------------------------------
def _stack_gate_up(parts: list[torch.Tensor]) -> torch.Tensor:
    """[gate_0, up_0, gate_1, up_1, ...], each [I, H] -> [E, 2I, H]."""
    return torch.stack([torch.cat(pair) for pair in zip(parts[0::2], parts[1::2])])


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """[down_0, down_1, ...], each [H, I] -> [E, H, I]."""
    return torch.stack(parts)


def restack_experts(path: Path, c: DeepseekV2Config, shapes: dict[str, tuple[int, ...]]) -> tuple[Combined, ...]:
    """Each MoE layer's per-expert tensors as its two stacked parameters; every expert present exactly once."""
    found: dict[int, dict[int, set[str]]] = {}  # layer -> expert -> projections
    for name in shapes:
        m = _EXPERT_TENSOR.fullmatch(name)
        if m:
            found.setdefault(int(m[1]), {}).setdefault(int(m[2]), set()).add(m[3])
    E, I, H = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size
    want = {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}
    out: list[Combined] = []
    moe_layers = [i for i in range(c.num_hidden_layers) if c.is_moe_layer(i)]
    for layer in sorted(set(found) | set(moe_layers)):
        experts = found.get(layer, {})
        stray = sorted(j for j in experts if layer not in moe_layers or j >= E)
        if stray:
            j = stray[0]
            if layer in moe_layers:
                where = f"the model has {E} routed experts per MoE layer"
            elif not moe_layers:
                where = f"the config makes every layer dense (n_routed_experts={E})"
            else:
                where = (f"layer {layer} is not an MoE layer here (layers {moe_layers[0]}..{moe_layers[-1]} are: "
                         f"first_k_dense_replace={c.first_k_dense_replace}, {c.num_hidden_layers} layers)")
            raise UnexpectedExpertError(path, layer, j, _name(layer, j, min(experts[j])),
                                        f"layer {layer} holds routed expert {j}, but {where}")
        stacked = f"model.layers.{layer}.mlp.experts.gate_up_proj"
        if not experts and stacked in shapes:
            continue  # stored stacked already: it loads by name like any other tensor
        for j in range(E):
            for proj in EXPERT_PROJS:
                if proj not in experts.get(j, ()):
                    raise MissingExpertError(path, layer, j, _name(layer, j, proj),
                                             f"layer {layer}, routed expert {j}: missing tensor "
                                             f"{_name(layer, j, proj)!r} (the model has {E} experts per MoE layer)")
                if tuple(shapes[_name(layer, j, proj)]) != want[proj]:
                    raise TensorShapeError(path, f"tensor {_name(layer, j, proj)!r} has shape "
                                                 f"{list(shapes[_name(layer, j, proj)])}, but expert {proj} "
                                                 f"needs {list(want[proj])}")
        gate_up = tuple(_name(layer, j, p) for j in range(E) for p in ("gate_proj", "up_proj"))
        out.append(Combined(stacked, gate_up, (E, 2 * I, H), _stack_gate_up))
        down = tuple(_name(layer, j, "down_proj") for j in range(E))
        out.append(Combined(f"model.layers.{layer}.mlp.experts.down_proj", down, (E, H, I), _stack))
    return tuple(out)


def _name(layer: int, expert: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"


DEEPSEEK_V2_ARCHITECTURE = Architecture(
    "deepseek_v2", None, (HF_ARCHITECTURE,), None, deepseek_v2_hf_config, hf_state_transform=restack_experts,
)
