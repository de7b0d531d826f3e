"""The held plan stays right across cache life-cycle operations, bit-exact against fresh runs.

On the run's KV strategy and on both offset paths (a latent cache has one), one held
context on one cache goes through, in order:

* first pass: prefill, then N forced tokens; equals a fresh context's run;
* truncate past the cached length: refused with ``KvCapacityError``, nothing changed;
* rollback: ``truncate_to(k)`` back into the decoded tokens and re-decode the same tokens
  gives the first pass's rows again; ``truncate_to(k)`` once more and decode other tokens
  gives a fresh run of that sequence (the first pass's tail stays in the cache past the
  new tokens throughout, so a leak of stale KV shows);
* ``reset()`` and reuse (a paged sequence frees its blocks, then re-grows from the pool, whose
  blocks still hold the old tokens): another prompt equals a fresh cache's run;
* a RoPE change mid-generation: ``set_rope_plan`` with other frequencies and scaling after
  h tokens of that prompt. Keys already cached keep the rotation they were written with;
  only new queries and keys use the new rows. So the expectation is a fresh context
  decoding the first h tokens with the old plan on a fresh cache, then a second fresh context
  given the new plan continuing on that same cache;
* ``recycle()`` and reuse: the cache each layout hands the next request (a cleared cache, a new
  allocation, rebound not rebuilt; a paged sequence's successor on the same pool, the same
  allocation, reused as is): equals a fresh run.

Every scenario also checks plan accounting: plan_once builds once for all of it, rebinds
only where the allocation changed and never refuses; replan builds once per decode
token. On a paged cache, one more check: after every operation (growth, refused and real
truncates, ``reset()``, ``recycle()``) the block table holds exactly the blocks the sequence owns, in
order, then the null block, and the pool's free list and owned blocks partition the pool
(``paged_invariants``). The negative control injects STALE_ROPE (a RoPE change never reaches decode).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.errors import KvCapacityError
from fuelpipe.kv.paged import PagedSequence
from fuelpipe.oracles.base import OracleInput, OracleResult, Setup
from fuelpipe.oracles.checks import Checks, accounting, decode_rows, forced_tokens, offset_paths
from fuelpipe.oracles.paged_invariants import audit
from fuelpipe.plan.validity import PlanValidity
from fuelpipe.rope import RopePlan, RopeScaling

MIN_TOKENS, MAX_TOKENS = 3, 6  # forced decode tokens per pass: enough for every scenario, few enough to stay cheap


def run(inp: OracleInput) -> OracleResult:
    vocab = inp.model.dims.vocab_size
    n = min(max(inp.new_tokens - 1, MIN_TOKENS), MAX_TOKENS)
    prompt = list(inp.prompts[0])
    other = list(inp.prompts[1]) if len(inp.prompts) > 1 else [(t + 1) % vocab for t in prompt]
    capacity = max(inp.max_seq_len, max(len(prompt), len(other)) + n)
    checks = Checks()
    paths = offset_paths(inp, inp.setup.kv.new_cache(inp.setup.context(inp.model), capacity))
    for mode, kind in paths:
        _scenarios(inp, inp.setup.with_changes(offset_mode=mode), kind, prompt, other, n, capacity, checks)
    ran = (f"{inp.setup.kv.layout} cache, {inp.setup.plan.value}, {n} forced tokens per pass, step path(s) "
           + ", ".join(kind for _, kind in paths))
    return checks.result("cache_lifecycle", ran)


def _changed_rope(plan: RopePlan) -> RopePlan:
    """Other frequencies and scaling, same rotated width and per-layer map (what set_rope_plan allows)."""
    scaled = RopeScaling("linear", 2.0)
    return RopePlan(tuple(replace(s, theta=s.theta * 4.0, scaling=scaled) for s in plan.specs), plan.layer_spec)


def _state(cache) -> tuple:
    """What a refused operation must leave as it was: length, allocation, owned bytes, block table."""
    table = cache.block_table()
    return cache.cached_len, cache.alloc_id, cache.nbytes(), None if table is None else table.clone()


def _same_state(a: tuple, b: tuple) -> bool:
    tables_equal = (a[3] is None and b[3] is None) or (
        a[3] is not None and b[3] is not None and torch.equal(a[3], b[3])
    )
    return a[:3] == b[:3] and tables_equal




def _scenarios(inp: OracleInput, setup: Setup, kind: str, prompt, other, n: int, capacity: int, checks: Checks) -> None:
    model = inp.model
    vocab = model.dims.vocab_size
    a, b, d = (forced_tokens(vocab, n, seed) for seed in (11, 12, 13))
    j = h = n // 2  # rows kept by the rollback; tokens decoded before the RoPE change
    m = n - j - 1  # replacement tokens: the first pass's last position stays stale past all of them
    tag = f"[{kind}]"
    held = setup.context(model, fault=inp.fault)
    stats = held.plan.stats
    once = held.plan.mode is PlanMode.plan_once
    decoded = [0]

    structure: list[str] = []  # paged only: block table and pool bookkeeping after every operation
    audits = [0]

    def check_structure(cache, after: str, released=()) -> None:
        if isinstance(cache, PagedSequence):
            audits[0] += 1
            structure.extend(audit([cache], released, cache.pool, f"after {after}"))

    def held_rows(cache, start, tokens):
        decoded[0] += len(tokens)
        rows = decode_rows(held, cache, start, tokens)
        check_structure(cache, f"decoding to length {cache.cached_len}")
        return rows

    def account(scenario: str, rebinds: int) -> None:
        if once:
            ok = stats.builds == 1 and stats.rebinds == rebinds and stats.last_validity is PlanValidity.VALID
            want = f"builds=1 rebinds={rebinds} validity=valid"
        else:
            ok = stats.builds == decoded[0] and stats.rebinds == 0
            want = f"builds={decoded[0]} rebinds=0"
        ok = ok and not stats.refusals
        checks.add(f"{tag} plan accounting after {scenario}", ok, f"{accounting(stats)}, expected {want}")

    cache = setup.kv.new_cache(held, capacity)
    first = held_rows(cache, prompt, a)  # n + 1 rows
    # The expectation: fresh caches, each written once from empty. One context serves two of them
    # (the second is a rebind, checked by rebind_guard), a second one the new RoPE plan.
    fresh = setup.context(model)
    want_alt = decode_rows(fresh, setup.kv.new_cache(fresh, capacity), prompt, a[:j] + b[:m])
    checks.rows(f"{tag} first pass equals a fresh run", want_alt[: j + 1], first[: j + 1])

    before, past, refused = _state(cache), sorted({cache.cached_len + 1, capacity + 1}), []
    for new_len in past:
        try:
            cache.truncate_to(new_len)
        except KvCapacityError:
            refused.append(new_len)
    check_structure(cache, "the refused truncates")
    checks.add(
        f"{tag} truncate past the length refused, nothing changed",
        refused == past and _same_state(_state(cache), before),
        f"cached_len {before[0]}: truncate_to{tuple(refused)} refused, cached_len now {cache.cached_len}",
    )

    k = len(prompt) + j
    floor = getattr(cache, "rewind_floor", 0)  # a ring cache that has wrapped cannot rewind (kv=ring)
    if k < floor:
        before = _state(cache)
        try:
            cache.truncate_to(k)
            refused = False
        except KvCapacityError:
            refused = True
        checks.add(f"{tag} truncate_to({k}) below the cache's rewind floor {floor} refused, nothing changed",
                   refused and _same_state(_state(cache), before),
                   f"refused={refused}, cached_len {before[0]} -> {cache.cached_len}")
    else:
        cache.truncate_to(k)
        check_structure(cache, f"truncate_to({k})")
        again = held_rows(cache, None, a[j:])
        checks.rows(f"{tag} truncate_to({k}) and re-decode the same tokens equals the first pass", first[j + 1 :],
                    again)
        cache.truncate_to(k)
        alt = held_rows(cache, None, b[:m])
        checks.rows(
            f"{tag} truncate_to({k}) and decode other tokens equals a fresh run (the stale tail never leaks)",
            want_alt[j + 1 :], alt,
        )
        account("truncate and rollback", 0)

    reset_name = "reset()"  # every cache's: empty for a new conversation, the allocation kept
    cache.reset()
    check_structure(cache, reset_name)
    changed = _changed_rope(model.rope_plan)
    got = held_rows(cache, other, d[:h])
    held.set_rope_plan(changed)
    got += held_rows(cache, None, d[h:])
    expected_cache = setup.kv.new_cache(fresh, capacity)
    want = decode_rows(fresh, expected_cache, other, d[:h])
    new_ctx = setup.context(model)
    new_ctx.set_rope_plan(changed)  # set before its first step: a fresh context given the new plan
    want += decode_rows(new_ctx, expected_cache, None, d[h:])
    checks.rows(f"{tag} {reset_name} and reuse for another prompt equals a fresh cache", want[: h + 1], got[: h + 1])
    checks.rows(
        f"{tag} RoPE change after {h} tokens equals a fresh context given the new RoPE plan",
        want[h + 1 :], got[h + 1 :],
    )
    account(f"{reset_name} and a RoPE change", 0)
    held.set_rope_plan(model.rope_plan)

    reuse_name = "recycle()"  # done with a request: the cache (or sequence) that serves the next
    old_id = cache.alloc_id
    old, cache = cache, cache.recycle()
    # The cache itself serves the next request on fresh storage (a new allocation: one rebind); a successor
    # (a pool's new sequence) shares the allocation the plan is welded to (reused as is).
    rebinds = int(cache is old)
    checks.add(f"{tag} recycle() gives a new allocation exactly when it hands back the same cache",
               (cache.alloc_id != old_id) == (cache is old),
               f"same cache: {cache is old}, allocation {old_id} -> {cache.alloc_id}")
    check_structure(cache, reuse_name, [old] if old is not cache else [])
    got = held_rows(cache, prompt, a[:j] + b[:m])
    checks.rows(f"{tag} {reuse_name} and reuse equals a fresh run", want_alt, got)
    account(reuse_name, rebinds)
    if audits[0]:
        checks.add(f"{tag} block table and pool partition after every operation", not structure,
                   "; ".join(structure[:3]) if structure else f"{audits[0]} audits clean")
