"""Several requests sharing KV storage, interleaved, on poisoned memory, each equal to its solo run.

What a serving engine does and a one-request check never sees:

* paged: three requests on ONE pool, its free list scrambled (blocks handed
  out non-contiguously and interleaved between requests), small blocks so
  every prompt spans several of them, and the third request's prompt as long
  as the capacity allows; every slot of the pool (the null block included)
  is NaN before anything runs; the first request finishes and frees its
  blocks, they are re-poisoned (Inf) and handed to the third request;
* contiguous and latent: three requests on caches whose every slot starts
  as NaN; the first finishes, its cache is reset, re-poisoned and reused by
  the third.

One context serves all three, decoding them interleaved token by token
(its held plan follows each cache). Each request's logits are compared
bit-exactly with its solo run on a clean, private cache of the same geometry.
The negative control injects UNSAFE_MASKED_SLOTS (masked slots reach
attention as they are), so the poison reaches the logits.
"""
from __future__ import annotations

import dataclasses

import torch

from fuelpipe.oracles.base import OracleInput, OracleResult, Setup, compare, greedy_run

BLOCK_SIZE_CAP = 4  # the oracle's pool uses blocks of at most this many positions: prompts span several
EXTRA_POSITIONS = 16  # capacity beyond the run's own, so the long prompt spans many blocks
NAN, INF = float("nan"), float("inf")


def _capacity(inp: OracleInput) -> int:
    return min(inp.model.dims.max_position_embeddings, inp.max_seq_len + EXTRA_POSITIONS)


def _requests(inp: OracleInput, capacity: int) -> list[tuple[int, ...]]:
    """Three prompts: the first two configured ones, and a long one filling the capacity."""
    first, second = inp.prompts[0], inp.prompts[1 % len(inp.prompts)]
    room = max(len(first), capacity - inp.new_tokens)
    long = (tuple(first) + tuple(second)) * (1 + room // max(1, len(first) + len(second)))
    return [tuple(first), tuple(second), long[:room]]


class _Storage:
    """Where the three requests' caches come from: one shared pool, or one cache each."""

    def __init__(self, inp: OracleInput, ctx, n_requests: int, capacity: int) -> None:
        kv = inp.setup.kv
        self.paged = kv.layout == "paged"
        self.inp, self.ctx, self.capacity = inp, ctx, capacity
        if self.paged:
            self.block_size = min(kv.block_size, BLOCK_SIZE_CAP)
            self.cap = -(-capacity // self.block_size)
            # room for every request at once, plus spare blocks so placement is not forced
            self.pool = ctx.new_pool(n_requests * self.cap + 4, self.block_size)
            for t in self.pool.k + self.pool.v:
                t.fill_(NAN)
            self.pool.scramble_free_list(seed=7)

    def cache(self):
        if self.paged:
            return self.pool.sequence(self.cap)
        cache = self.inp.setup.kv.new_cache(self.ctx, self.capacity)
        for t in cache.bound_tensors():
            t.fill_(NAN)
        return cache

    def recycle(self, cache):
        """Finish a request: free its blocks or reset its cache, then poison what it held, and reuse it."""
        if self.paged:
            blocks = list(cache.blocks)
            cache.free()
            for t in self.pool.k + self.pool.v:
                t[blocks] = INF
            return self.pool.sequence(self.cap)
        cache.reset()
        for t in cache.bound_tensors():
            t.fill_(INF)
        return cache

    def private_setup(self) -> Setup:
        """The solo runs' setup: same geometry, a clean private cache per request."""
        if not self.paged:
            return self.inp.setup
        kv = dataclasses.replace(self.inp.setup.kv, block_size=self.block_size, num_blocks=None)
        return self.inp.setup.with_changes(kv=kv)


def run(inp: OracleInput) -> OracleResult:
    capacity = _capacity(inp)
    prompts = _requests(inp, capacity)
    shared = inp.setup.context(inp.model, fault=inp.fault)
    storage = _Storage(inp, shared, len(prompts), capacity)
    solo_setup = storage.private_setup()
    solo = []
    for prompt in prompts:
        ctx = solo_setup.context(inp.model)
        solo.append(greedy_run(ctx, solo_setup.kv.new_cache(ctx, capacity), prompt, inp.new_tokens))

    got: list[list[torch.Tensor]] = [[] for _ in prompts]
    caches: dict[int, object] = {}

    def begin(r: int, cache) -> None:
        caches[r] = cache
        got[r].append(shared.prefill(cache, list(prompts[r]))[0])

    # Request 0 starts alone, request 1 joins half-way, and when request 0 is done its
    # storage (freed, re-poisoned) serves request 2 while request 1 is still decoding.
    begin(0, storage.cache())
    joins_at = max(1, inp.new_tokens // 2)
    for round_ in range(3 * inp.new_tokens):
        if round_ == joins_at:
            begin(1, storage.cache())
        for r in sorted(caches):
            n = len(got[r])
            if n < inp.new_tokens:
                got[r].append(shared.decode(caches[r], solo[r][0][n - 1])[0])
        if 0 in caches and len(got[0]) == inp.new_tokens and 2 not in caches:
            begin(2, storage.recycle(caches.pop(0)))
        if all(len(rows) == inp.new_tokens for rows in got):
            break

    results = [compare(logits, rows) for (_, logits), rows in zip(solo, got)]
    worst = max(w for w, _ in results)
    diverged = [(r, f) for r, (_, f) in enumerate(results) if f is not None]
    layout = f"one pool of {storage.pool.num_blocks} blocks x {storage.block_size}" if storage.paged else \
        f"{inp.setup.kv.layout} caches"
    return OracleResult(
        name="kv_sharing",
        passed=not diverged,
        metric={"max_abs_error": worst, "requests": len(prompts), "requests_diverged": len(diverged),
                "first_divergent_step": min((f for _, f in diverged), default=None),
                "prompt_lengths": [len(p) for p in prompts]},
        tolerance=0.0,
        detail=f"{len(prompts)} requests interleaved on {layout}, NaN-poisoned, the first's storage re-poisoned "
        f"and reused by the third; torch.equal vs solo runs over {inp.new_tokens} tokens each "
        f"(builds {shared.plan.stats.builds}, rebinds {shared.plan.stats.rebinds})"
        + ("; diverged: " + ", ".join(f"request {r} at step {f}" for r, f in diverged) if diverged else ""),
    )


def fault_setup(setup: Setup) -> Setup:
    """UNSAFE_MASKED_SLOTS bites where attention reads slots beyond the live length: the tensor path."""
    return setup.with_changes(offset_mode="tensor") if setup.kv.layout == "contiguous" else setup
