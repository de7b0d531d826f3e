"""Every request of a continuously batched run equals its own B = 1 run.

The shared schedule (``batch_runs``) runs through one ``ContinuousBatcher``:
rows of different lengths, joins and leaves mid-run, bucket changes, padding
rows and a refused request. Each served greedy request must produce the same
tokens as its solo run (at least 32 of them) and logits within the dtype's
tolerance (scaled by the logit size: a GEMM and a GEMV round differently).
The refused one must be refused with a typed error, alone. Beside them, the
schedule's seeded sampled requests (live at once) are checked against their
own seeds and a teacher-forced solo run (``batch_compare``).

When the setup names no offset path and the layout has a second batch step
(batch-slot and paged caches: their ``symbol`` steps attend only the longest
row's prefix), the greedy requests run again on that path with short budgets,
compared with the prefix of their solo runs. On a paged cache the block tables
and the pool are audited after every step (``paged_invariants``), and a pool
too small for its requests must make admission wait (``batch_tight_pool``).
The negative control injects SHARED_BATCH_POSITION (every row decoded at row 0's position).
"""
from __future__ import annotations

import dataclasses

from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.modes import PlanMode
from fuelpipe.errors import InputError, KvCapacityError
from fuelpipe.kv.batch import PagedBatch
from fuelpipe.oracles.base import OracleInput, OracleResult
from fuelpipe.oracles.batch_compare import Tally, check_sampled
from fuelpipe.oracles.batch_runs import batcher, forced_rows, schedule, solo_runs
from fuelpipe.oracles.batch_tight_pool import run_tight
from fuelpipe.oracles.checks import offset_paths
from fuelpipe.oracles.paged_invariants import serve_audited

OTHER_PATH_TOKENS = 3  # greedy tokens of the first request on the second offset path; request i has i more
OTHER_PATH_ROWS = 4  # requests on it, all live at once in one bucket (one plan build; rows leave, padding appears)


def run(inp: OracleInput) -> OracleResult:
    sched = schedule(inp)
    solo_ctx = inp.setup.context(inp.model, plan=PlanMode.plan_once)  # one reference plan, rebound per cache
    solo = solo_runs(solo_ctx, inp, sched.requests, sched.capacity)
    tally = Tally(inp.tolerance)
    b = batcher(inp, sched.capacity, keep_logits=True)
    results = [b.submit(req) for req in sched.requests[:2]]
    refused = b.submit(sched.refused)  # refused between the others: it must not disturb them
    sampled = [b.submit(req) for req in sched.sampled]  # live together beside the greedy ones
    results += [b.submit(req) for req in sched.requests[2:]]
    paths = offset_paths(inp, b.kv)
    structure, audits = serve_audited(b)
    tally.problems += structure
    if refused.finish != "refused" or not isinstance(refused.error, (KvCapacityError, InputError)):
        tally.problems.append(f"the too-long request ended {refused.finish!r} ({refused.error!r}), expected refused "
                              "with a KvCapacityError or InputError")
    for res, (tokens, logits) in zip(results, solo):
        tally.greedy(res, tokens, logits)
    forced = [forced_rows(solo_ctx, inp, sched.capacity, res.request.prompt_ids, res.tokens) for res in sampled]
    streams = check_sampled(sampled, forced, tally)
    for mode, kind in paths[1:]:
        audits += _other_path(inp, sched, solo, mode, kind, tally)
    tight = run_tight(solo_ctx, inp, sched.capacity, tally) if isinstance(b.kv, PagedBatch) else {}
    d = b.describe()
    min_tokens = min(len(t) for t, _ in solo)
    paged = (f"; {audits} structure audits clean" if audits else "") + (
        "; tight pool: admission waited, the over-sized request refused" if tight.get("tight_pool_waited") else "")
    return OracleResult(
        name="batch_vs_solo",
        passed=not tally.problems,
        metric={"max_abs_error": tally.worst, "allowed": tally.allowed, "requests": len(results),
                "tokens_compared": tally.compared, "min_tokens": min_tokens, "steps": d["steps"],
                "mean_batch": d["mean_batch"], "builds_per_bucket": d["builds_per_bucket"], "refused": d["refused"],
                "sampled_requests": len(sampled), "sampled_streams": streams,
                "offset_paths": [kind for _, kind in paths], "structure_audits": audits, **tight},
        tolerance=inp.tolerance,
        detail=tally.detail() if tally.problems else
        f"{len(results)} greedy requests (>= {min_tokens} tokens each) and {len(sampled)} seeded sampled ones equal "
        f"their solo runs ({tally.compared} rows, max err {tally.worst:.3g} <= {tally.allowed:.3g}); mean batch "
        f"{d['mean_batch']:.2f} over {d['steps']} steps; step paths {', '.join(k for _, k in paths)}; the too-long "
        f"request refused alone{paged}",
    )


def _other_path(inp: OracleInput, sched, solo, mode: str, kind: str, tally: Tally) -> int:
    """The first greedy requests with short budgets on offset path ``mode``, all live at once in one bucket,
    against their solo runs' prefixes. The first has the shortest prompt: row 0 is never the longest row."""
    ctx = inp.setup.with_changes(offset_mode=mode).context(inp.model, fault=inp.fault)
    n = min(OTHER_PATH_ROWS, inp.batch.max_batch, len(sched.requests))
    short = [dataclasses.replace(r, max_new_tokens=OTHER_PATH_TOKENS + i)
             for i, r in enumerate(sched.requests[:n])]
    b = batcher(dataclasses.replace(inp, batch=BatchSpec(n, (n,))), sched.capacity, ctx=ctx, keep_logits=True)
    results = [b.submit(r) for r in short]
    structure, audits = serve_audited(b)
    tally.problems += [f"[{kind}] {p}" for p in structure]
    for res, (tokens, logits) in zip(results, solo):
        tally.greedy(res, tokens, logits, f"[{kind}] ")
    return audits
