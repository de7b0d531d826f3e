"""The decode path: fuelpipe's decoder skeleton, with the window as mask-plan data (no attention code of its own).

``MISTRAL_SW_PLANTED_BUG=1`` plants a bug that fuelpipe's oracles must catch: the
attention memoises one fused q/k/v weight the first time a step is built and
keeps using it after the weights change (an in-place update, a reload, a deep
copy given other values). Every plan built afterwards is wrong at full speed.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from fuelpipe.decoder_skeleton import GroupedQueryAttention, NormFactory, PreNormLayer, StackedDecoder
from fuelpipe.layers import GatedMLP
from fuelpipe.masks import SLIDING, MaskPlan
from fuelpipe.rope import RopePlan, RopeSpec
from fuelpipe_mistral_sw.config import ROPE_FIELDS, MistralSwConfig

PLANTED_BUG = os.environ.get("MISTRAL_SW_PLANTED_BUG") == "1"


class Attention(GroupedQueryAttention):
    """The shared attention; only the planted bug replaces its projection."""

    def project(self, x: torch.Tensor):
        return self._memoised_qkv(x) if PLANTED_BUG else super().project(x)

    def _memoised_qkv(self, x: torch.Tensor):
        """The planted bug: the fused weight is read once (raw, outside the traced graph) and never refreshed."""
        if "_fused" not in self.__dict__:
            ws = [m._parameters["weight"].detach().clone() for m in (self.q_proj, self.k_proj, self.v_proj)]
            self.__dict__["_fused"] = torch.cat(ws)
        qkv = F.linear(x, self.__dict__["_fused"])
        return qkv.split(self.split, dim=-1)


class MistralSwModel(StackedDecoder):
    family = "mistral_sw"
    rope_fields = ROPE_FIELDS
    offset_mode = "tensor"

    def build_layer(self, index: int, norm: NormFactory, device, dtype) -> PreNormLayer:
        c: MistralSwConfig = self.config
        attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                         bias=c.attention_bias, device=device, dtype=dtype)
        mlp = GatedMLP(c.hidden_size, c.intermediate_size, "silu", c.mlp_bias, device, dtype)
        return PreNormLayer(c.hidden_size, norm, attn, mlp)

    def ties_head(self) -> bool:
        return False  # Mistral's head is always its own

    def build_mask_plan(self) -> MaskPlan:
        # The family's variation is data: every layer is a sliding-window layer.
        return MaskPlan((SLIDING,) * self.config.num_hidden_layers, self.config.sliding_window)

    def build_rope_plan(self) -> RopePlan:
        return rope_plan_of(self.config)

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None, kv_out=None) -> torch.Tensor:
        from fuelpipe_mistral_sw.reference import reference_logits

        return reference_logits(self, token_ids, rope_plan or rope_plan_of(self.config), kv_out)


def rope_plan_of(c: MistralSwConfig) -> RopePlan:
    return RopePlan.uniform(RopeSpec(theta=c.rope_theta, rotary_dim=c.head_dim), c.num_hidden_layers)
