"""The decode path: fuelpipe's shared pieces, with the window as mask-plan data (no attention code of its own).

``MISTRAL_SW_PLANTED_BUG=1`` plants a bug that fuelpipe's oracles must catch: the
attention memoises one fused q/k/v weight the first time a step is built and
keeps using it after the weights change (an in-place update, a reload, a deep
copy given other values). Every plan built afterwards is wrong at full speed.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from fuelpipe.backbone import DecodeDims, LayerInputs
from fuelpipe.family import DecoderModel
from fuelpipe.layers import GatedMLP, RMSNorm, cached_attention, merge_heads, split_heads
from fuelpipe.masks import SLIDING, MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from fuelpipe_mistral_sw.config import ROPE_FIELDS, MistralSwConfig

PLANTED_BUG = os.environ.get("MISTRAL_SW_PLANTED_BUG") == "1"


class Attention(nn.Module):
    def __init__(self, c: MistralSwConfig, device=None, dtype=None) -> None:
        super().__init__()
        d = c.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim, self.scale = c.num_attention_heads, c.num_key_value_heads, d, d**-0.5
        kw = dict(bias=c.attention_bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(c.hidden_size, self.n_heads * d, **kw)
        self.k_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.v_proj = nn.Linear(c.hidden_size, self.n_kv_heads * d, **kw)
        self.o_proj = nn.Linear(self.n_heads * d, c.hidden_size, **kw)

    def forward(self, x: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        if PLANTED_BUG:
            q, k, v = self._memoised_qkv(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = split_heads(q, self.n_heads, self.head_dim)  # [B, H, T, D]
        k = split_heads(k, self.n_kv_heads, self.head_dim)  # [B, Hkv, T, D]
        v = split_heads(v, self.n_kv_heads, self.head_dim)  # [B, Hkv, T, D]
        return self.o_proj(merge_heads(cached_attention(q, k, v, inputs, self.scale, self.head_dim, self.head_dim)))

    def _memoised_qkv(self, x: torch.Tensor):
        """The planted bug: the fused weight is read once (raw, outside the traced graph) and never refreshed."""
        if "_fused" not in self.__dict__:
            ws = [m._parameters["weight"].detach().clone() for m in (self.q_proj, self.k_proj, self.v_proj)]
            self.__dict__["_fused"] = torch.cat(ws)
        qkv = F.linear(x, self.__dict__["_fused"])
        return qkv.split([self.n_heads * self.head_dim] + [self.n_kv_heads * self.head_dim] * 2, dim=-1)


class Layer(nn.Module):
    def __init__(self, c: MistralSwConfig, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = Attention(c, device, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", c.mlp_bias, device, dtype)

    def forward(self, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), inputs)
        return h + self.mlp(self.post_attention_layernorm(h))


class MistralSwModel(DecoderModel):
    family = "mistral_sw"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def __init__(self, config: MistralSwConfig, *, device=None, dtype=torch.float32) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Layer(c, device, dtype) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, device=device, dtype=dtype)
        self.requires_grad_(False)
        self.dims = DecodeDims(
            n_layers=c.num_hidden_layers, hidden_size=c.hidden_size, n_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, vocab_size=c.vocab_size,
            max_position_embeddings=c.max_position_embeddings,
        )
        # The family's variation is data: every layer is a sliding-window layer.
        self.mask_plan = MaskPlan((SLIDING,) * c.num_hidden_layers, c.sliding_window)
        self.rope_plan = rope_plan_of(c)

    # ---- DecodeBackbone ------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        return self.layers[index](h, inputs)

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None, kv_out=None) -> torch.Tensor:
        from fuelpipe_mistral_sw.reference import reference_logits

        return reference_logits(self, token_ids, rope_plan or rope_plan_of(self.config), kv_out)


def rope_plan_of(c: MistralSwConfig) -> RopePlan:
    return RopePlan.uniform(RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim), c.num_hidden_layers)
