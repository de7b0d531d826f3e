"""The tiny twin: where the gate asks a question the checkpoint's weights cannot change.

Most oracles ask about the engine, not the checkpoint: does a held plan notice new weights, is a refused
rebind whole, do batched rows stay apart, does the plan cache key see what it must. The answer depends
on the family's structure (its per-layer masks, RoPE plans, cache layout, step kinds) and not on the
weights' values, so asking it of a multi-gigabyte checkpoint buys nothing but time and memory: every
such oracle builds its own plans, and some another copy of the model. Those oracles
(``OracleSpec.needs_checkpoint`` False) run, when the model is a checkpoint, on the family's registered
``tiny`` size with random weights, in the same dtype, weight format, cache layout, backend and plan
mode, and their result names the twin (``setup.model``). The tiny sizes are built so each structural
difference bites in a short test (Gemma 3's is an 8-position window, not 512). Oracles whose answer is
about the weights (the held fast path vs the eager reference and transformers, quantization bounds,
kernels at the model's widths, the variants' numerics) run on the checkpoint itself. ``plan_vs_replan``
(a held plan against one built afresh each token: the same arithmetic on any weights) runs on the twin,
while ``vs_reference`` asks the weights' question of the same held plan.

A random model is its own twin: every oracle runs on it (a ``tiny_dense`` DeepSeek must not be asked
about the MoE ``tiny``). The twin has the tiny size's structure, not the checkpoint's structural options
(a checkpoint without DeepSeek's q low-rank projection is still asked about the engine with one): the
checkpoint's own structure is exercised, on its weights, by the held plan in ``vs_reference``.
``experiment.mechanism_on_twin=false`` runs every oracle on the checkpoint itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch

from fuelpipe.backbone import DecodeBackbone
from models.registry import build_random_model, families

TWIN_SIZE = "tiny"
TWIN_SEED = 0


@dataclass(frozen=True)
class Twin:
    """A model for the mechanism oracles, with the inputs they take."""

    model: DecodeBackbone
    other_model: Callable[[], DecodeBackbone]
    dense_model: Optional[Callable[[], DecodeBackbone]]
    prompts: tuple[tuple[int, ...], ...]  # the experiment's prompts folded into the twin's vocabulary
    max_seq_len: int
    label: str  # how a result names it


def twin_for(family: str, dtype: torch.dtype, device: torch.device, quant,
             prompts: tuple[tuple[int, ...], ...], max_seq_len: int) -> Optional[Twin]:
    """A checkpoint's tiny twin, or None when its family has no ``tiny`` size (an installed family: its
    oracles all run on the checkpoint)."""
    entry = families().get(family)
    if entry is None or TWIN_SIZE not in entry.sizes:
        return None
    build = partial(_build, family, dtype, device, quant)
    model = build(TWIN_SEED)
    vocab, positions = model.dims.vocab_size, model.dims.max_position_embeddings
    if max_seq_len > positions:
        return None  # the experiment writes more positions than the twin has
    folded = tuple(tuple(t % vocab for t in p) for p in prompts)
    dense = None if quant is None else partial(_build, family, dtype, device, None, TWIN_SEED)
    return Twin(model, partial(build, TWIN_SEED + 1), dense, folded, max_seq_len,
                f"{family} {TWIN_SIZE} twin (random weights, seed {TWIN_SEED})")


def _build(family: str, dtype: torch.dtype, device: torch.device, quant, seed: int) -> DecodeBackbone:
    model = build_random_model(family, TWIN_SIZE, seed=seed, dtype=dtype, device=device)
    if quant is not None:
        from fuelpipe.quant.modules import quantize_model

        quantize_model(model, quant)
    return model
