"""Test scaffolding around the transformers twins (``fuelpipe.oracles.hf_twin``): random twins and growing forwards.

The config mapping and the weight naming live in the package, where the
``vs_transformers`` oracle uses them; here ``build_pair`` randomises the HF
model (norm scales included, so an ordering bug cannot hide behind ones or
zeros) and loads the same weights into the fuelpipe model by name.
"""
from __future__ import annotations

import torch

from fuelpipe.oracles.hf_twin import hf_config, hf_model, load_from_hf, twins
from models.registry import build_config, family

HF_TWINS = twins()  # every registered family's twin (models/<family>/twin.py), by family name

__all__ = ["HF_TWINS", "build_pair", "hf_config", "hf_logits_growing", "hf_model", "load_from_hf", "randomize_hf"]


@torch.no_grad()
def randomize_hf(model: torch.nn.Module, seed: int, std: float = 0.05, norm_spread: float = 0.3) -> None:
    """Every parameter random. A 1-D weight is a norm scale here: it moves around its init (1, or 0 for (1 + w))."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if p.dim() == 1 and not name.endswith("bias"):
            p.add_(norm_spread * (torch.rand(p.shape, generator=gen) * 2 - 1))
        else:
            p.copy_(std * torch.randn(p.shape, generator=gen))


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
