"""A held plan moved onto another allocation is checked against the storage baked into it.

On the run's KV strategy and offset path, under plan_once (rebinds exist only there), one
held context meets, in order:

* a rebind refused half-way: a source whose first layers are interchangeable with the
  plan's bound storage and whose last layer's last slot is carved from a larger buffer
  (same shape and strides, other extent). ``rebind_kv`` must refuse it naming that slot,
  and leave the session's bound KV (tensor identities) and key exactly as they were; the
  plan then still serves its original cache bit-exact against a solo run, without a build;
* an interchangeable allocation (a new cache of the same geometry): rebound, not rebuilt,
  and bit-exact; for a paged cache also a second sequence of the same pool (same
  allocation: reused as is);
* the carved source through the driver: the rebind is refused and the plan rebuilt, and
  the logits equal a solo run;
* the same layout at another capacity (a contiguous or latent ``max_seq_len``; a paged
  pool of other ``num_blocks``, a sequence of other ``max_blocks_cap``): stale and rebuilt,
  or refused and rebuilt, never silently reused; the logits equal a solo run on a cache
  made the same way;
* a cache of another dtype: the context refuses it with a ``ConfigError`` before anything
  runs (the cache and the plan untouched), and a direct ``rebind_kv`` onto it is refused.

Plan accounting (builds, rebinds, refusals) is checked after every scenario. The negative
control injects PARTIAL_REBIND (``rebind_kv`` commits each slot as it checks it, so the
half-way refusal leaves a half-rebound plan).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.errors import ConfigError
from fuelpipe.oracles.base import OracleInput, OracleResult
from fuelpipe.oracles.checks import Checks, accounting, decode_rows, forced_tokens
from fuelpipe.plan.validity import PlanValidity, RebindRefusal, RebindRefused, RefusalReason

TOKENS = 4  # forced decode tokens: the build token, one reuse, then two more after the half-way refusal
STALE, REFUSED = "stale", "refused"  # how a non-interchangeable cache must be turned down (both rebuild)


def _carved(t: torch.Tensor) -> torch.Tensor:
    """``t``'s shape and strides, carved from a larger buffer: a storage the plan cannot be rebound onto."""
    arena = torch.zeros(t.numel() + t.shape[-1], dtype=t.dtype, device=t.device)  # one row longer
    return arena[: t.numel()].view(t.shape)


@dataclass(frozen=True)
class _Layout:
    """How the oracle makes caches of one KV layout for a context ``ctx``."""

    # (ctx, capacity, dtype) -> a cache with room for two sequences' worth of positions when paged
    base: Callable
    # (label, (ctx, capacity) -> cache, STALE | REFUSED), in the order they are met
    others: Callable[[int], tuple]
    carve_last_slot: Callable  # replaces the last layer's last slot in place with a carved copy
    # cache -> another cache on the same allocation (a paged pool's second sequence); None: the layout has none
    sibling: Optional[Callable] = None


def _new_cache(ctx, capacity, dtype=None):
    return ctx.new_cache(capacity, dtype)


def _carve_contiguous(cache) -> None:
    cache.layers[-1].v = _carved(cache.layers[-1].v)


def _carve_latent(cache) -> None:
    cache.slots[-1][-1] = _carved(cache.slots[-1][-1])


def _paged(block_size: int) -> _Layout:
    def blocks(capacity: int) -> int:
        return -(-capacity // block_size)

    def base(ctx, capacity, dtype=None):
        return ctx.new_pool(2 * blocks(capacity) + 1, block_size, dtype).sequence(blocks(capacity))

    def others(capacity: int) -> tuple:
        n = blocks(capacity)
        return (
            # same geometry in the key, a pool of another size: only the storage check can see it
            ("a pool of other num_blocks", lambda ctx, c: ctx.new_pool(2 * n + 4, block_size).sequence(n), REFUSED),
            # another width: the key's geometry differs (a block_size change is keyed the same way)
            ("max_blocks_cap + 1", lambda ctx, c: ctx.new_pool(n + 2, block_size).sequence(n + 1), STALE),
        )

    def carve(seq) -> None:
        seq.pool.v[-1] = _carved(seq.pool.v[-1])

    return _Layout(base, others, carve, lambda seq: seq.pool.sequence(seq.max_blocks_cap))


def _layout(inp: OracleInput) -> _Layout:
    if inp.setup.kv.layout == "paged":
        return _paged(inp.setup.kv.block_size)
    limit = inp.model.dims.max_position_embeddings

    def others(capacity: int) -> tuple:
        # another capacity: longer, or one shorter where the model allows no longer one (still room for the run)
        other = capacity + 8 if capacity + 8 <= limit else capacity - 1
        return ((f"max_seq_len {other} (held: {capacity})", lambda ctx, c: ctx.new_cache(other), STALE),)

    carve = _carve_latent if inp.setup.kv.layout == "latent" else _carve_contiguous
    return _Layout(_new_cache, others, carve)


def run(inp: OracleInput) -> OracleResult:
    model = inp.model
    layout = _layout(inp)
    setup = inp.setup.with_changes(plan=PlanMode.plan_once)
    prompt = list(inp.prompts[0])
    tokens = forced_tokens(model.dims.vocab_size, TOKENS, seed=21)
    capacity = max(inp.max_seq_len, len(prompt) + TOKENS)
    checks = Checks()

    def solo(make: Callable, n: int = TOKENS) -> list[torch.Tensor]:
        ctx = setup.context(model)
        return decode_rows(ctx, make(ctx), prompt, tokens[:n])

    want = solo(lambda ctx: layout.base(ctx, capacity))
    held = setup.context(model, fault=inp.fault)
    stats = held.plan.stats
    expected = {"builds": 1, "rebinds": 0, "refusals": 0}

    def account(scenario: str, validity: Optional[PlanValidity] = None) -> None:
        seen = {"builds": stats.builds, "rebinds": stats.rebinds, "refusals": len(stats.refusals)}
        ok = seen == expected and (validity is None or stats.last_validity is validity)
        want_v = "" if validity is None else f" validity={validity.value}"
        checks.add(f"plan accounting after {scenario}", ok,
                   f"{accounting(stats)}, expected " + " ".join(f"{k}={v}" for k, v in expected.items()) + want_v)

    # The held plan, built on its original cache.
    original = layout.base(held, capacity)
    got = decode_rows(held, original, prompt, tokens[:2])

    # (c) a rebind refused half-way leaves the session exactly as it was.
    session = held.plan.session
    half = layout.base(held, capacity)
    layout.carve_last_slot(half)
    bound, key = session.bound_kv(), session.key
    refusal = _try_rebind(session, half)
    last_layer = model.dims.n_layers - 1
    checks.add(
        "rebind refused half-way, at the last layer",
        refusal is not None and refusal.reason is RefusalReason.STORAGE_DIFFERS and refusal.layer == last_layer,
        f"refusal: {refusal}, expected storage_differs at layer={last_layer}",
    )
    after = session.bound_kv()
    moved = [i for i, (a, b) in enumerate(zip(bound, after)) if a is not b]
    checks.add(
        "refused rebind left the bound KV and the key untouched",
        not moved and len(after) == len(bound) and session.key == key,
        f"{len(moved)} of {len(bound)} bound slots moved, key {'kept' if session.key == key else 'changed'}",
    )
    got += decode_rows(held, original, None, tokens[2:])
    checks.rows("after the refusal the plan still serves its original cache", want, got)
    account("the half-way refusal", PlanValidity.VALID)

    # (d) an interchangeable allocation is rebound, not rebuilt.
    again = layout.base(held, capacity)
    checks.rows("an interchangeable allocation: rows", want[:3], decode_rows(held, again, prompt, tokens[:2]))
    expected["rebinds"] += 1
    account("an interchangeable allocation (rebound)")
    if layout.sibling is not None:  # another sequence of the same pool: the same allocation
        sibling = layout.sibling(again)
        checks.rows("another sequence of the same pool: rows", want[:2], decode_rows(held, sibling, prompt, tokens[:1]))
        account("another sequence of the same pool (reused as is)", PlanValidity.VALID)

    # (b) another dtype, while the plan is bound to a cache of the same geometry: refused by the
    # context before anything runs, and by the rebind guard (nothing but the dtype and extent differ).
    _other_dtype(held, layout, capacity, checks)
    account("a cache of another dtype (refused before anything ran)")

    # (a) same layout, storage that differs: the carved source through the driver, then other capacities.
    carved = layout.base(held, capacity)
    layout.carve_last_slot(carved)
    checks.rows("a same-geometry cache whose storage differs: rows", want[:3],
                decode_rows(held, carved, prompt, tokens[:2]))
    expected["builds"] += 1
    expected["refusals"] += 1
    account("a same-geometry cache whose storage differs (refused, rebuilt)")
    for label, make, verdict in layout.others(capacity):
        rows = decode_rows(held, make(held, capacity), prompt, tokens[:2])
        checks.rows(f"{label}: rows equal a solo run on the same kind of cache", solo(lambda ctx: make(ctx, capacity), 2),
                    rows)
        expected["builds"] += 1
        expected["refusals"] += verdict == REFUSED
        account(f"{label} ({verdict}, rebuilt)")

    ran = (f"{inp.setup.kv.layout} cache, plan_once, step path {session.step_kind}, scenarios: half-way refusal, "
           "interchangeable rebind, other dtype, differing storage, "
           + ", ".join(label for label, _, _ in layout.others(capacity)))
    return checks.result("rebind_guard", ran)


def _try_rebind(session, source) -> Optional[RebindRefusal]:
    try:
        session.rebind_kv(source)
    except RebindRefused as refused:
        return refused.refusal
    return None


def _other_dtype(held, layout: _Layout, capacity: int, checks: Checks) -> None:
    dtype = torch.bfloat16 if held.dtype != torch.bfloat16 else torch.float32
    cache = layout.base(held, capacity, dtype)
    session, stats = held.plan.session, held.plan.stats
    before = (stats.builds, stats.rebinds, len(stats.refusals))
    refused = []
    for name, call in (("prefill", lambda: held.prefill(cache, [1])), ("decode", lambda: held.decode(cache, 1))):
        try:
            call()
        except ConfigError:
            refused.append(name)
    table = cache.block_table()  # a paged sequence must not have taken a block
    untouched = (
        cache.cached_len == 0
        and (table is None or not bool(table.any()))
        and held.plan.session is session
        and (stats.builds, stats.rebinds, len(stats.refusals)) == before
    )
    checks.add(
        f"a {dtype} cache refused with ConfigError before anything ran",
        refused == ["prefill", "decode"] and untouched,
        f"ConfigError on {refused or 'nothing'}; cache length {cache.cached_len}, plan {'kept' if untouched else 'touched'}",
    )
    bound, key = session.bound_kv(), session.key
    refusal = _try_rebind(session, cache)
    kept = all(a is b for a, b in zip(bound, session.bound_kv())) and session.key == key
    checks.add(
        f"a direct rebind onto the {dtype} cache refused, plan untouched",
        refusal is not None and refusal.reason is RefusalReason.STORAGE_DIFFERS and kept,
        f"refusal: {refusal}",
    )
