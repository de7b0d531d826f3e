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


def draw(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> int:
    """One temperature / top-k draw from logits [1, vocab], taking its randomness from ``generator`` only."""
    check_finite(logits[0])
    row = logits[0].float().cpu() / temperature  # [vocab]
    if top_k:
        kth = torch.topk(row, min(top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def seeded(temperature: float = 1.0, top_k: int = 0, seed: int = 0) -> Sampler:
    """A sampler with its own generator, seeded once: the same seed and logits draw the same tokens."""
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0 (use greedy for 0), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0, got {top_k}")
    gen = torch.Generator().manual_seed(seed)
    return lambda logits: draw(logits, temperature, top_k, gen)
