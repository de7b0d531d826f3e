"""Token samplers: greedy, and seeded temperature / top-k sampling."""
from __future__ import annotations

from typing import Callable

import torch

from fuelpipe.errors import ConfigError, NonFiniteLogitsError

Sampler = Callable[[torch.Tensor], int]


def check_finite(row: torch.Tensor) -> None:
    """Refuse a logits row [vocab] holding NaN or Inf: argmax of NaNs is a token id, not an answer."""
    finite = torch.isfinite(row)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten()
        first = int(bad[0])
        raise NonFiniteLogitsError(
            f"logits row holds {bad.numel()} non-finite values of {row.numel()} (first: id {first} = "
            f"{float(row[first])}); refusing to sample a token from it"
        )


def greedy(logits: torch.Tensor) -> int:
    """logits: [1, vocab] -> argmax id (a non-finite row raises NonFiniteLogitsError)."""
    check_finite(logits[0])
    return int(torch.argmax(logits[0]))


def seeded(temperature: float = 1.0, top_k: int = 0, seed: int = 0) -> Sampler:
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0 (use greedy for 0), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0, got {top_k}")
    gen = torch.Generator().manual_seed(seed)

    def sample(logits: torch.Tensor) -> int:
        check_finite(logits[0])
        row = logits[0].float().cpu() / temperature
        if top_k:
            kth = torch.topk(row, min(top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))

    return sample
