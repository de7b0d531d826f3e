"""Shared fixtures: tiny deterministic models and small decode helpers."""
from __future__ import annotations

import os

import pytest
import torch

from fuelpipe.context import InferenceContext
from models.registry import build_random_model

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

PROMPT = [3, 17, 42, 7, 99]


@pytest.fixture(scope="session")
def tiny_llama():
    return build_random_model("llama", "tiny", seed=1)


def decode_logits(ctx: InferenceContext, cache, prompt, steps: int, tokens=None) -> list[torch.Tensor]:
    """Prefill ``prompt``, then decode ``steps`` tokens (greedy unless ``tokens`` forces them).

    Returns one [vocab] f32 row per step: the prefill's last row, then each decode step's.
    """
    out = [ctx.prefill(cache, prompt)[0]]
    for i in range(steps):
        tok = tokens[i] if tokens is not None else int(torch.argmax(out[-1]))
        out.append(ctx.decode(cache, tok)[0])
    return out


def fed_sequence(prompt, logits, tokens=None) -> list[int]:
    """The full token sequence that produced ``logits`` (prompt + tokens fed to each decode step)."""
    seq = list(prompt)
    for i, row in enumerate(logits[:-1]):
        seq.append(tokens[i] if tokens is not None else int(torch.argmax(row)))
    return seq
