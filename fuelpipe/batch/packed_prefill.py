"""Several joining sequences' prompts in one call: the packed prompt step.

When requests join a batch, each needs its prompt run before it can decode.
One prompt at a time, every call pays the whole step's fixed cost (hundreds of
small ops, the program's Python) and every linear reads its weights for one
prompt's rows. Packed, the prompts are concatenated into one row of N tokens:

    tokens     p0 p0 p0 p0 | p1 p1 | p2 p2 p2        (N = 9)
    positions   0  1  2  3 |  0  1 |  0  1  2        each prompt from 0
    segment     0  0  0  0 |  1  1 |  2  2  2

Token n attends token m only within its own segment, causally (and within
the sliding window on windowed layers): the mask is block-diagonal. Because
every packed sequence is fresh (nothing cached yet), every key a prompt
token may attend is in the step, and the cache is only written: each token's
K/V land at its own sequence's slot and position (or paged offset). The
logits returned are those of each prompt's last token. Linears run once on
all N rows, so there is no padding and no per-prompt call.

Each sequence's result equals its own one-sequence prefill (the
``batch_vs_solo`` oracle compares the whole stream; the tests compare the
logits and the written K/V per family and cache kind). The segment ids that
keep prompts apart pass through the context's ``PlanPolicy.packed_segment``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from fuelpipe.context import InferenceContext
from fuelpipe.token_ids import token_id_list
from fuelpipe.errors import InputError, KvCacheError
from fuelpipe.masks import MaskPlan, allowed
from fuelpipe.kv.layout import signature_for
from fuelpipe.step import step_module_for


@dataclass(frozen=True)
class PackedPrompts:
    """The host data of one packed step (N tokens from n prompts)."""

    token_ids: torch.Tensor  # [1, N] int64
    positions: torch.Tensor  # [N] int64: each token's position in its own sequence
    segment: torch.Tensor  # [N] int64: which prompt each token belongs to
    last_index: torch.Tensor  # [n] int64: each prompt's last token in the packed row


def pack_prompts(prompts: Sequence[Sequence[int]]) -> PackedPrompts:
    lengths = [len(p) for p in prompts]
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)[None]  # [1, N]
    positions = torch.cat([torch.arange(n) for n in lengths])  # [N]
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # [N]
    last_index = torch.tensor(lengths).cumsum(0) - 1  # [n]
    return PackedPrompts(ids, positions, segment, last_index)


def packed_mask_variants(plan: MaskPlan, positions: torch.Tensor, segment: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    """Additive masks [n_variants, 1, 1, N, N]: token n attends m iff same segment, causal, within the window."""
    same = segment[:, None] == segment[None, :]  # [N, N]
    rows = [allowed(positions, positions, plan.window_of(kind)) & same for kind in plan.variants]
    ok = torch.stack(rows)[:, None, None]  # [V, 1, 1, N, N]
    return torch.zeros(ok.shape, dtype=dtype).masked_fill_(~ok, float("-inf"))


def _checked(ctx: InferenceContext, kv, rows: Sequence, prompts: Sequence) -> tuple[list, list[list[int]]]:
    rows = list(rows)
    prompts = [token_id_list(p, f"packed prefill: prompt {i}") for i, p in enumerate(prompts)]
    if not rows:
        raise InputError("packed prefill needs at least one sequence")
    if len(prompts) != len(rows):
        raise InputError(f"packed prefill needs one prompt per sequence: {len(rows)} sequences, "
                         f"{len(prompts)} prompts")
    if len({id(r) for r in rows}) != len(rows):
        raise InputError("packed prefill lists a sequence twice; each prompt must go to a different sequence")
    vocab, limit = ctx.model.dims.vocab_size, ctx.model.dims.max_position_embeddings
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        if not kv.owns(row):
            raise InputError(f"packed prefill: sequence {i} is not a live sequence of this batch cache "
                             "(acquire it from the cache; a released one is gone)")
        if row.cached_len != 0:
            raise InputError(f"packed prefill serves fresh sequences only: sequence {i} already holds "
                             f"{row.cached_len} positions (run its next tokens with ctx.prefill or a decode step)")
        if not prompt:
            raise InputError(f"packed prefill: prompt {i} is empty; a prompt holds at least one token")
        bad = sorted({t for t in prompt if not 0 <= t < vocab})
        if bad:
            raise InputError(f"packed prefill: prompt {i} token ids must lie in [0, {vocab}), got {bad[:8]}")
        if len(prompt) > limit:
            raise InputError(f"packed prefill: prompt {i} has {len(prompt)} tokens, more than the model's "
                             f"max_position_embeddings {limit}")
        if len(prompt) > kv.width:
            raise KvCacheError(f"packed prefill: prompt {i} has {len(prompt)} tokens, more than a row of this cache "
                               f"holds ({kv.width} positions)")
    kv.check_packed_room(rows, [len(p) for p in prompts])  # all of it, before anything is taken
    for row, prompt in zip(rows, prompts):
        row.check_room(0, len(prompt))
    return rows, prompts


@torch.no_grad()
def packed_prefill(ctx: InferenceContext, kv, rows: Sequence, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Prefill ``prompts[i]`` into the fresh sequence ``rows[i]`` of batch cache ``kv``, all in one step.

    Returns each prompt's next-token logits [n, vocab] f32. Every argument is checked (and every
    block a paged prompt needs is taken) before anything runs; the rows advance by their prompt
    lengths afterwards.
    """
    ctx.check_batch_cache(kv)
    rows, prompts = _checked(ctx, kv, rows, prompts)
    packed = pack_prompts(prompts)
    segment = ctx.plan.policy.packed_segment(packed.segment)
    signature = signature_for(kv, ctx.offset_mode, packed=True)  # the batch cache's layout owns its packed step
    cos, sin = ctx.rope_tables()  # [n_specs, P, rot]
    dev, dtype = ctx.device, ctx.dtype
    writes = {k: v.to(dev) for k, v in kv.packed_writes(rows, [len(p) for p in prompts]).items()}
    named = dict(writes, last_index=packed.last_index.to(dev))
    args = [packed.token_ids.to(dev),
            cos[:, packed.positions][:, None].to(dev, dtype),  # [n_specs, 1, N, rot]
            sin[:, packed.positions][:, None].to(dev, dtype),
            packed_mask_variants(ctx.model.mask_plan, packed.positions, segment, dtype).to(dev),  # [V, 1, 1, N, N]
            *(named[name] for name in signature.inputs), kv.bound_tensors()]
    program = ctx.prefill_plans.step(ctx.model, signature.name, lambda: step_module_for(ctx.model, signature))
    logits = program(*args)  # [n, vocab]
    for row, prompt in zip(rows, prompts):
        row.advance(len(prompt))
        row.bump_all_versions()
    return logits
