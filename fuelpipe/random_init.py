"""Deterministic random weights for tiny test models (norm weights random too, never all ones)."""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0, std: float = 0.02, norm_spread: float = 0.2) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        leaf = name.rsplit(".", 1)[-1]
        is_norm = "norm" in name.split(".")[-2] if "." in name else False
        if is_norm and leaf == "weight":
            base = 0.0 if getattr(_owner(model, name), "unit_offset", False) else 1.0
            val = base + norm_spread * (torch.rand(p.shape, generator=gen) * 2 - 1)
        elif leaf == "bias":
            val = std * torch.randn(p.shape, generator=gen)
        else:
            val = std * torch.randn(p.shape, generator=gen)
        p.copy_(val.to(p.dtype))
    return model


def _owner(model: nn.Module, param_name: str) -> nn.Module:
    return model.get_submodule(param_name.rsplit(".", 1)[0])
