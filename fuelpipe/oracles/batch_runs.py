"""The request schedule the batch oracles share, and its solo (B = 1) reference runs.

``max_batch + 2`` requests of different prompt lengths and token budgets, so
that rows leave at different steps, queued requests join mid-run, the batch
moves between buckets and padding rows appear; plus one request too long for
a row, which must be refused on its own while the others run; plus three seeded
sampled requests (temperature > 0) on one prompt: two seeds, one of them twice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from fuelpipe.batch import ContinuousBatcher, Request, Sampling
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.base import OracleInput
from fuelpipe.oracles.checks import decode_rows
from fuelpipe.sampling import greedy

MIN_TOKENS = 32  # generated tokens per request: greedy streams are compared over at least this many
STAGGER = 3  # extra tokens per request, so rows finish (and leave) on different steps
SAMPLED_TOKENS = 8  # tokens per seeded sampled request
SAMPLED_SEEDS = (1234, 4321, 1234)  # two requests share a seed (and prompt): they must draw the same tokens
SAMPLED_TEMPERATURE = 1.5  # hot enough that two random streams pick different tokens of a tiny model


@dataclass(frozen=True)
class Schedule:
    requests: tuple[Request, ...]
    refused: Request  # too long for a row: must be refused, alone
    capacity: int  # positions per row (and per solo cache)
    sampled: tuple[Request, ...] = ()  # seeded temperature sampling, live beside each other


def repeat_to(prompt: Sequence[int], n: int) -> tuple[int, ...]:
    """``prompt`` repeated and cut to ``n`` tokens."""
    return tuple((list(prompt) * (1 + n // len(prompt)))[:n])


def schedule(inp: OracleInput, min_tokens: int = MIN_TOKENS) -> Schedule:
    base = [list(p) for p in inp.prompts if p] or [[1, 2, 3]]
    tokens = max(min_tokens, inp.new_tokens)
    reqs = []
    for i in range(inp.batch.max_batch + 2):
        p = base[i % len(base)]
        rotated = p[i % len(p):] + p[: i % len(p)]
        length = 1 + (3 * i) % (len(p) + 3)  # 1, 4, 7, ... (ragged rows)
        reqs.append(Request(repeat_to(rotated, length), tokens + STAGGER * (i % 4), name=f"r{i}"))
    capacity = max(r.positions for r in reqs)
    capacity = min(capacity, inp.model.dims.max_position_embeddings)
    long = capacity + 64  # past a row's width (a paged row rounds up to whole blocks)
    refused = Request(repeat_to(base[0], long), 2, name="too-long")
    prompt = tuple(base[0][:6])
    sampled = tuple(Request(prompt, SAMPLED_TOKENS, sampling=Sampling(SAMPLED_TEMPERATURE, 0, seed), name=f"s{i}")
                    for i, seed in enumerate(SAMPLED_SEEDS))
    return Schedule(tuple(reqs), refused, capacity, sampled)


def solo_runs(ctx: InferenceContext, inp: OracleInput, requests: Sequence[Request], capacity: int):
    """Each greedy request alone (B = 1) on ``ctx`` (plan_once), on a one-sequence cache as wide as a batch
    row (``capacity`` positions): (tokens, logits rows).

    Always plan_once: the reference is the B = 1 function, and that replan computes the same one
    bit for bit is ``plan_vs_replan``'s check (a replan reference would rebuild, or recompile under
    inductor, for every one of its tokens and add nothing).
    """
    out = []
    for req in requests:
        cache = inp.setup.kv.new_cache(ctx, capacity)
        res = ctx.generate(list(req.prompt_ids), req.max_new_tokens, sampler=greedy, cache=cache, keep_logits=True)
        out.append((res.tokens, res.logits))
    return out


def forced_rows(ctx: InferenceContext, inp: OracleInput, capacity: int, prompt, tokens: list[int]):
    """The logits rows a solo run gives when teacher-forced on ``tokens`` (what a sampled request drew):
    the prompt's row, then one per fed token but the last, [len(tokens)] rows of [vocab]."""
    return decode_rows(ctx, inp.setup.kv.new_cache(ctx, capacity), list(prompt), tokens[:-1])


def batcher(inp: OracleInput, capacity: int, ctx: InferenceContext | None = None, num_blocks: Optional[int] = None,
            **kw) -> ContinuousBatcher:
    """A batcher over a fresh batch cache; by default its pool fits every row (the schedule decides), or
    ``num_blocks`` blocks (paged only, the null block included) when a scenario wants a tight pool."""
    ctx = ctx or inp.setup.context(inp.model, fault=inp.fault)
    kv = dataclasses.replace(inp.setup.kv, num_blocks=num_blocks)
    kv = kv.new_batch(ctx, inp.batch.max_batch, capacity)
    return ContinuousBatcher(ctx, kv, inp.batch, **kw)
