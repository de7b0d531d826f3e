"""Base class for model families: identity, weights version and shape key come for free."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fuelpipe.identity import ModelInstanceId, shape_key, structure_fields


class DecoderModel(nn.Module):
    """Common identity plumbing. A subclass sets ``family``, ``config``, ``rope_fields`` and the plans."""

    family: str = ""
    rope_fields: tuple[str, ...] = ()
    offset_mode: str = "tensor"
    # Trailing shapes of the per-layer latent KV slots for MLA families; None = K/V heads cache.
    latent_slots: tuple[tuple[int, ...], ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        # Minted per constructed model, never recycled: a plan built for this model
        # can never be judged valid for another one, whatever the allocator does.
        self.instance_id = ModelInstanceId.mint()
        self._shape_key: int | None = None
        self._tensors: list[torch.Tensor] | None = None

    def structure(self) -> dict[str, Any]:
        """Every structure-affecting config field (RoPE fields excluded: per-token data)."""
        return structure_fields(self.config, self.rope_fields)

    def shape_key(self) -> int:
        if self._shape_key is None:
            self._shape_key = shape_key(self.family, self.structure(), self.instance_id)
        return self._shape_key

    def weights_version(self) -> int:
        """Sum of the weight tensors' in-place version counters: moves on any in-place update."""
        if self._tensors is None:
            self._tensors = [p for p in self.parameters()] + [b for b in self.buffers()]
        return sum(t._version for t in self._tensors)

    def _apply(self, fn, *args, **kwargs):  # .to()/.cuda() replace tensors: refresh the list
        self._tensors = None
        return super()._apply(fn, *args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self._tensors = None
        return super().load_state_dict(*args, **kwargs)
