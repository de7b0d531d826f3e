"""Decode runners and deliberate decode-side corruptions shared by the family tests.

A corruption rewrites only the data the decode path runs on (``mask_plan``,
``rope_plan``). The oracles never read that data: the transformers twin is
built from the config, and each family's reference derives windows and RoPE
from the config too. So a corruption must make both oracles fail.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.masks import FULL, SLIDING, MaskPlan
from fuelpipe.rope import RopePlan

PROMPT = [3, 17, 42, 7, 99]
WINDOW = 8  # the tiny configs' sliding window
DECODE_STEPS = 3 * WINDOW  # prompt + 24 tokens: every window boundary (8, 16, 24) is crossed
TOKEN_SEED = 1234


def forced_tokens(n: int = DECODE_STEPS, vocab: int = 256, seed: int = TOKEN_SEED) -> list[int]:
    """Teacher-forced decode tokens: random, so a tiny model's repetitive argmax cannot hide anything."""
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class Decoded:
    ctx: InferenceContext
    cache: object
    sequence: list[int]  # prompt + forced tokens
    logits: torch.Tensor  # [1 + steps, vocab] f32: prefill's last row, then one row per decode step
    builds: list[int] = field(default_factory=list)  # plan builds after each decode step
    realize_counts: list[int] = field(default_factory=list)  # held session's realize_count after each step
    node_counts: list = field(default_factory=list)  # held program's node count after each step


def run_decode(
    model, tokens, *, backend="fx", plan="plan_once", offset_mode=None, fault=Fault.NONE, prompt=PROMPT, capacity=64
) -> Decoded:
    """Prefill ``prompt``, then decode each of ``tokens`` through the held plan, recording the plan's accounting."""
    ctx = InferenceContext(model, backend, plan, offset_mode=offset_mode, policy=policy_for(fault))
    cache = ctx.new_cache(capacity)
    rows = [ctx.prefill(cache, prompt)[0]]
    builds, realize_counts, node_counts = [], [], []
    for tok in tokens:
        rows.append(ctx.decode(cache, tok)[0])
        session = ctx.plan.session
        builds.append(ctx.plan.stats.builds)
        realize_counts.append(session.realize_count if session is not None else None)
        node_counts.append(session.node_count if session is not None else None)
    return Decoded(ctx, cache, list(prompt) + list(tokens), torch.stack(rows), builds, realize_counts, node_counts)


def reference_rows(model, decoded: Decoded, prompt_len: int = len(PROMPT)) -> torch.Tensor:
    """The family's own no-cache reference, aligned with ``Decoded.logits``."""
    return model.reference_logits(torch.tensor([decoded.sequence]))[0, prompt_len - 1 :]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ---- deliberate corruptions of the decode-side data ---------------------------------------
def _set_mask(model, layer_types, window) -> None:
    model.mask_plan = MaskPlan(tuple(layer_types), window)


def window_ignored(model) -> None:
    _set_mask(model, (FULL,) * model.dims.n_layers, None)


def window_on_every_layer(model) -> None:
    _set_mask(model, (SLIDING,) * model.dims.n_layers, model.mask_plan.sliding_window)


def window_off_by_one(model) -> None:
    """Attends ``window + 1`` positions: the classic ``<=`` for ``<`` in the distance test."""
    _set_mask(model, model.mask_plan.layer_types, model.mask_plan.sliding_window + 1)


def layer_pattern_shifted(model) -> None:
    """Layer kinds rotated by one (e.g. global when ``i % 6 == 0`` instead of ``(i + 1) % 6 == 0``)."""
    kinds = model.mask_plan.layer_types
    _set_mask(model, kinds[-1:] + kinds[:-1], model.mask_plan.sliding_window)


def global_rope_on_local_layers(model) -> None:
    plan = model.rope_plan
    global_spec = plan.layer_spec[model.mask_plan.layer_types.index(FULL)]
    model.rope_plan = replace(plan, layer_spec=(global_spec,) * len(plan.layer_spec))


def _rotary_width(model, width: int) -> None:
    plan = model.rope_plan
    model.rope_plan = RopePlan(tuple(replace(s, rotary_dim=width) for s in plan.specs), plan.layer_spec)


def rotary_whole_head(model) -> None:
    """Partial rotary ignored: the whole head is rotated."""
    _rotary_width(model, model.dims.head_dim)


def rotary_half_width(model) -> None:
    """Partial rotary applied twice: only the leading quarter of a half-rotated head is rotated."""
    _rotary_width(model, model.rope_plan.rotary_dim // 2)


FAULTS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "window_ignored": (window_ignored, ("phi", "qwen3", "gemma3")),
    "window_on_every_layer": (window_on_every_layer, ("qwen3", "gemma3")),
    "window_off_by_one": (window_off_by_one, ("phi", "qwen3", "gemma3")),
    "layer_pattern_shifted": (layer_pattern_shifted, ("qwen3", "gemma3")),
    "global_rope_on_local_layers": (global_rope_on_local_layers, ("gemma3",)),
    "rotary_whole_head": (rotary_whole_head, ("phi",)),
    "rotary_half_width": (rotary_half_width, ("phi",)),
}

FAULT_CASES = [(fam, name) for name, (_, fams) in FAULTS.items() for fam in fams]
