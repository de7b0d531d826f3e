"""Does the persistent plan cache serve a stored plan only to the plan it was built for?

On every backend, the content key a stored plan is filed under is checked first, with
no compilation (``plan_cache_keys``: both halves, from other weights, geometry, thread
count, pass source, pass list and -march that must change it to a fresh context,
another instance of the same weights and another position that must not).

The stored plans themselves are checked where a plan cache is configured (``backend=aot``, whose default
``backend.plan_cache.dir=auto`` is the user's cache folder, or ``backend=inductor backend.plan_cache.dir=...``),
in a private folder of its own (removed afterwards: the oracle corrupts an entry, and a
shared folder's published entries never change under its other readers; nor can a small
``max_gb`` or another worker evict what it checks), with fresh contexts (nothing held in
memory carries over, as in a new process). Every plan is compiled there at least once, so
the oracle costs a few AOT builds. Both halves:

Must reuse (a cache that never hits throws the saving away):
* building the same plan twice: the second build is a ``hit`` of the first one's entry,
  and its logits are bit-identical to the first build's.

Must not reuse (a cache that hits too readily serves a wrong answer at full speed):
* the same config with other weights (one element changed): another entry (a different key)
  where the weights are baked in (inductor); where the programs take the weights as arguments
  (aot's layer programs) the same entry, run on the other weights; either way, logits equal to
  that model's own reference run;
* the same model at another geometry (a cache of another capacity): another entry (inductor), the
  same one (aot: the capacity is a symbol of the program), and that geometry's reference logits;
* a corrupted entry (one payload byte flipped): reported ``corrupt`` and rebuilt, never
  loaded, and the rebuilt plan computes the same logits.

Every served plan's logits are compared with the eager reference on the same model,
within the run's tolerance. The negative control keys entries without the weight digest
(Fault.PLAN_CACHE_IGNORES_WEIGHTS): other weights then load the first model's plan, whose
weights are baked in, and its logits are the first model's.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.base import OracleInput, OracleResult, compare, compare_scaled
from fuelpipe.oracles.checks import Check
from fuelpipe.oracles.plan_cache_keys import key_checks, one_element_changed
from fuelpipe.plan.backends import BACKENDS
from fuelpipe.plan.plan_store import PAYLOAD, PlanStore
from fuelpipe.sampling import greedy

NAME = "plan_cache"


@dataclass
class Served:
    status: str
    key: str
    logits: list[torch.Tensor]
    weights_bound: bool = False  # its stored programs take the weights as arguments (backend=aot)


def _serve(inp: OracleInput, model, max_seq_len: int, tokens: list[int]) -> Served:
    """Prefill and decode ``tokens`` on a fresh plan_once context; the decode plan's cache event and logits."""
    ctx = inp.setup.context(model, plan=PlanMode.plan_once, fault=inp.fault)
    cache = inp.setup.kv.new_cache(ctx, max_seq_len)
    logits = [ctx.prefill(cache, list(inp.prompts[0]))[0]]
    logits += [ctx.decode(cache, t)[0] for t in tokens]
    event = ctx.plan.session.program.cache_event
    return Served(event.status if event else "none", event.key if event else "", logits,
                  bool(event and event.weights_bound))


def _reference(inp: OracleInput, model, max_seq_len: int, tokens: list[int]) -> list[torch.Tensor]:
    ctx = inp.setup.with_backend("eager").context(model, plan=PlanMode.plan_once)
    cache = inp.setup.kv.new_cache(ctx, max_seq_len)
    return [ctx.prefill(cache, list(inp.prompts[0]))[0]] + [ctx.decode(cache, t)[0] for t in tokens]


def _matches_reference(inp, name: str, served: Served, want: list[torch.Tensor]) -> Check:
    worst, first_bad, _, allowed = compare_scaled(want, served.logits, inp.tolerance or 0.0)
    return Check(f"{name}: logits equal the eager reference", first_bad is None,
                 f"max abs {worst:g} (allowed {allowed:g}, entry {served.status})", worst)


def _flip_a_byte(store: PlanStore, digest: str) -> None:
    path = store.entry(digest) / PAYLOAD
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def run(inp: OracleInput) -> OracleResult:
    checks = key_checks(inp)
    pc = inp.setup.backend.plan_cache
    stored = BACKENDS.get(inp.setup.backend.name).stores_plans and pc.enabled
    first_build = "not stored: keys only (backend=inductor or aot with backend.plan_cache.dir stores plans)"
    if stored:
        private = tempfile.mkdtemp(prefix="fuelpipe-plan-cache-oracle-")
        try:
            # seeded from the run's folder: a program it holds is copied (verified), not compiled again
            own = dataclasses.replace(pc, dir=private, max_gb=1e6, seed=pc.dir)
            setup = inp.setup.with_changes(backend=dataclasses.replace(inp.setup.backend, plan_cache=own))
            first_build, served = _stored(dataclasses.replace(inp, setup=setup))
            checks += served
        finally:
            shutil.rmtree(private, ignore_errors=True)
    failed = [f"{c.name} ({c.seen})" for c in checks if not c.ok]
    return OracleResult(
        name=NAME,
        passed=not failed,
        metric={"checks": len(checks), "failed_checks": len(failed), "max_abs_error": max(c.error for c in checks),
                "first_build": first_build},
        tolerance=inp.tolerance,
        detail="failed: " + "; ".join(failed) if failed else "; ".join(f"{c.name}: {c.seen}" for c in checks),
    )


def _stored(inp: OracleInput) -> tuple[str, list[Check]]:
    """(the first build's cache status, the checks of plans stored and served from the oracle's own folder)."""
    pc = inp.setup.backend.plan_cache
    n = inp.max_seq_len
    ref_ctx = inp.setup.with_backend("eager").context(inp.model, plan=PlanMode.plan_once)
    first_token = greedy(ref_ctx.prefill(inp.setup.kv.new_cache(ref_ctx, n), list(inp.prompts[0])))
    tokens = [first_token, (first_token + 1) % inp.model.config.vocab_size]
    want = _reference(inp, inp.model, n, tokens)

    first = _serve(inp, inp.model, n, tokens)  # a hit or a compile: either is right here
    checks = [_matches_reference(inp, "first build", first, want)]
    again = _serve(inp, inp.model, n, tokens)
    worst, bad = compare(first.logits, again.logits)
    checks += [
        Check("same plan again: a hit", again.status == "hit" and again.key == first.key,
              f"status {again.status}, same key {again.key == first.key}"),
        Check("same plan again: logits bit-identical", bad is None, f"max abs {worst:g}", worst),
    ]

    other = one_element_changed(inp.model)  # a checkpoint's other_model is a reload: the same weights
    served = _serve(inp, other, n, tokens)
    if first.weights_bound:  # programs that take the weights: the same entry, run on the other weights
        checks.append(Check("other weights: the same entry, the other weights bound",
                            served.status == "hit" and served.key == first.key,
                            f"status {served.status}, key {'same' if served.key == first.key else 'differs'}"))
    else:  # weights baked into the entry: another key
        checks.append(Check("other weights: another entry", served.key != first.key, f"status {served.status}, "
                            f"key {'differs' if served.key != first.key else 'is the first model key'}"))
    checks.append(_matches_reference(inp, "other weights", served, _reference(inp, other, n, tokens)))

    wider = n + 16
    served = _serve(inp, inp.model, wider, tokens)
    if first.weights_bound:  # a KV capacity is a symbol of the program: served by the same entry
        checks.append(Check("other geometry: the same entry (capacity is a symbol)",
                            served.status == "hit" and served.key == first.key,
                            f"status {served.status}, capacity {wider} vs {n}"))
    else:
        checks.append(Check("other geometry: another entry", served.key != first.key, f"status {served.status}, "
                            f"capacity {wider} vs {n}"))
    checks.append(_matches_reference(inp, "other geometry", served, _reference(inp, inp.model, wider, tokens)))

    store = PlanStore(pc.dir, pc.max_bytes)
    entries = [k for k in first.key.split("+") if k]
    if entries and all((store.entry(k) / PAYLOAD).is_file() for k in entries):
        for k in entries:
            _flip_a_byte(store, k)
        served = _serve(inp, inp.model, n, tokens)
        checks += [
            Check("corrupted entry: rebuilt, not loaded", served.status == "corrupt", f"status {served.status}"),
            _matches_reference(inp, "corrupted entry rebuilt", served, want),
        ]
    else:
        checks.append(Check("corrupted entry: rebuilt, not loaded", False,
                            f"the first build's entry {first.key} is not in the oracle's own folder {pc.dir}"))

    return first.status, checks
