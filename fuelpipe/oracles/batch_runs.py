"""The request schedule the batch oracles share, and its solo (B = 1) reference runs.

``max_batch + 2`` requests of different prompt lengths and token budgets, so
that rows leave at different steps, queued requests join mid-run, the batch
moves between buckets and padding rows appear; plus one request too long for
a row, which must be refused on its own while the others run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fuelpipe.batch import ContinuousBatcher, Request
from fuelpipe.context import InferenceContext
from fuelpipe.driver import PlanMode
from fuelpipe.oracles.base import OracleInput
from fuelpipe.sampling import greedy

MIN_TOKENS = 32  # generated tokens per request: greedy streams are compared over at least this many
STAGGER = 3  # extra tokens per request, so rows finish (and leave) on different steps


@dataclass(frozen=True)
class Schedule:
    requests: tuple[Request, ...]
    refused: Request  # too long for a row: must be refused, alone
    capacity: int  # positions per row (and per solo cache)


def schedule(inp: OracleInput, min_tokens: int = MIN_TOKENS) -> Schedule:
    base = [list(p) for p in inp.prompts if p] or [[1, 2, 3]]
    tokens = max(min_tokens, inp.new_tokens)
    reqs = []
    for i in range(inp.batch.max_batch + 2):
        p = base[i % len(base)]
        rotated = p[i % len(p):] + p[: i % len(p)]
        length = 1 + (3 * i) % (len(p) + 3)  # 1, 4, 7, ... (ragged rows)
        prompt = (rotated * (1 + length // len(p)))[:length]
        reqs.append(Request(tuple(prompt), tokens + STAGGER * (i % 4), name=f"r{i}"))
    capacity = max(r.positions for r in reqs)
    capacity = min(capacity, inp.model.dims.max_position_embeddings)
    long = capacity + 64  # past a row's width (a paged row rounds up to whole blocks)
    refused = Request(tuple((base[0] * (1 + long // len(base[0])))[:long]), 2, name="too-long")
    return Schedule(tuple(reqs), refused, capacity)


def solo_runs(inp: OracleInput, sched: Schedule):
    """Each request alone (B = 1) on a one-sequence cache as wide as a batch row: (tokens, logits rows).

    Always plan_once: the reference is the B = 1 function, and that replan computes the same one
    bit for bit is ``plan_vs_replan``'s check (a replan reference would rebuild, or recompile under
    inductor, for every one of its tokens and add nothing).
    """
    ctx = inp.setup.context(inp.model, plan=PlanMode.PLAN_ONCE)
    out = []
    for req in sched.requests:
        cache = inp.setup.kv.new_cache(ctx, sched.capacity)
        res = ctx.generate(list(req.prompt_ids), req.max_new_tokens, sampler=greedy, cache=cache, keep_logits=True)
        out.append((res.tokens, res.logits))
    return out


def batcher(inp: OracleInput, capacity: int, ctx: InferenceContext | None = None, **kw) -> ContinuousBatcher:
    ctx = ctx or inp.setup.context(inp.model, fault=inp.fault)
    kv = dataclasses.replace(inp.setup.kv, num_blocks=None)  # the pool fits every row: the schedule decides
    kv = kv.new_batch(ctx, inp.batch.max_batch, capacity)
    return ContinuousBatcher(ctx, kv, inp.batch, **kw)
