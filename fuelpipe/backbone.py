"""The one decode-backbone interface every model family implements.

The shared driver (``fuelpipe.driver``) only ever talks to a family through
this interface. What varies per family is data (``mask_plan``, ``rope_plan``,
``offset_mode``) plus the family's own ``apply_layer``; the build, rebind and
realize path is the same code for all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from fuelpipe.identity import ModelInstanceId
from fuelpipe.masks import MaskPlan
from fuelpipe.modes import OffsetMode, values
from fuelpipe.rope import RopePlan

OFFSET_MODES = values(OffsetMode)  # the runtime's strings; the enum (fuelpipe.modes) is the one list


@dataclass(frozen=True)
class DecodeDims:
    """Model-scalar geometry the shared path needs."""

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int


@dataclass
class LayerInputs:
    """Everything one layer's decode step receives, bundled so signatures stay short.

    cos, sin: [B, 1, T, rot] rows of this layer's RoPE spec (one row set per sequence; broadcast over heads).
    mask:     [B, 1, T, S] additive mask of this layer's variant.
    kv:       this layer's KV view (see ``fuelpipe.kv.views``).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    kv: Any


@runtime_checkable
class DecodeBackbone(Protocol):
    family: str
    dims: DecodeDims
    mask_plan: MaskPlan
    rope_plan: RopePlan
    offset_mode: str
    latent_slots: tuple[tuple[int, ...], ...] | None
    instance_id: ModelInstanceId

    def shape_key(self) -> int: ...

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor: ...

    def apply_layer(self, index: int, h: torch.Tensor, inputs: LayerInputs) -> torch.Tensor: ...

    def final(self, h: torch.Tensor) -> torch.Tensor: ...

    def reference_logits(self, token_ids: torch.Tensor, rope_plan: RopePlan | None = None) -> torch.Tensor: ...
