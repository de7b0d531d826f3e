"""UNSAFE_MASKED_SLOTS: KV views that hand masked slots to attention as the buffer holds them.

Every production view returns only attendable data (a masked slot comes back as
exactly 0, ``fuelpipe.kv.views``), and the views that attend in one call read only
live slots. Here each view a step makes is recast as its faulty twin: the cleaning
is skipped and attention runs over everything the view gathered, so a recycled
block's NaN reaches SDPA (NaN x 0 = NaN) and ``kv_sharing`` must notice.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.kv.layout import StepSignature, ViewFactory
from fuelpipe.step import step_module_for


class KeepsMaskedGarbage:
    """Mixin placed before a view's own class: nothing it returns is cleaned."""

    def _visible(self, x: torch.Tensor, mask: torch.Tensor, slot_dim: int) -> torch.Tensor:
        return x

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
        """SDPA over the gathered, uncleaned K/V (what ``cached_attention`` does for a view without ``attend``)."""
        keys, values, mask = self.write_and_read(k, v, mask)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)


@functools.lru_cache(maxsize=None)
def _garbage_keeping(cls: type) -> type:
    return type(f"{cls.__name__}KeepingGarbage", (KeepsMaskedGarbage, cls), {})


def keeping_masked_garbage(views: ViewFactory) -> ViewFactory:
    """``views`` whose every view keeps its masked garbage (each is made by ``views``, then recast)."""

    def make(backbone, inputs: dict, kv: list) -> list:
        made = views(backbone, inputs, kv)
        for view in made:
            view.__class__ = _garbage_keeping(type(view))  # a fresh view of this call only
        return made

    return make


def step_keeping_masked_garbage(backbone: DecodeBackbone, signature: StepSignature) -> nn.Module:
    """The step module of ``signature`` with views that keep their masked garbage."""
    return step_module_for(backbone, replace(signature, views=keeping_masked_garbage(signature.views)))
