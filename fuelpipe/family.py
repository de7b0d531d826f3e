"""Base class for model families: identity, weights version and shape key come for free."""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from fuelpipe.identity import ModelInstanceId, shape_key, structure_fields


def _on_tensor_registered(module: nn.Module, name: str, tensor) -> None:
    """Global registration hook: replacing a parameter or buffer bumps its model's weights epoch."""
    owner = getattr(module, "_fuelpipe_owner", None)
    model = owner() if owner is not None else None
    if model is not None:
        model._bump_weights_epoch()


nn_module.register_module_parameter_registration_hook(_on_tensor_registered)
nn_module.register_module_buffer_registration_hook(_on_tensor_registered)


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
        self._weights_epoch = 0

    def structure(self) -> dict[str, Any]:
        """Every structure-affecting config field (RoPE fields excluded: per-token data)."""
        return structure_fields(self.config, self.rope_fields)

    def shape_key(self) -> int:
        if self._shape_key is None:
            self._shape_key = shape_key(self.family, self.structure(), self.instance_id)
        return self._shape_key

    def _bump_weights_epoch(self) -> None:
        self._weights_epoch += 1
        self._tensors = None

    def weights_version(self) -> tuple[int, int]:
        """(epoch, sum of in-place version counters) of the weights: moves on any change to them.

        The epoch is bumped whenever a weight tensor is replaced (attribute assignment,
        ``load_state_dict``, ``.to()``); within an epoch the tensors are fixed and their
        version counters only grow, so the pair never repeats an earlier value.
        """
        if self._tensors is None:
            ref = weakref.ref(self)
            for sub in self.modules():
                sub._fuelpipe_owner = ref
            self._tensors = [p for p in self.parameters()] + [b for b in self.buffers()]
        return self._weights_epoch, sum(t._version for t in self._tensors)

    def _apply(self, fn, *args, **kwargs):  # .to()/.cuda() may replace tensors or their data
        self._bump_weights_epoch()
        return super()._apply(fn, *args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self._bump_weights_epoch()
        return super().load_state_dict(*args, **kwargs)
