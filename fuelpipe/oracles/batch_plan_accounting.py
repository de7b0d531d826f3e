"""Plan accounting across joins and leaves: one build per bucket used, none inside a bucket.

The shared schedule runs through a ``ContinuousBatcher`` (plan_once), a
refused request included. Every batched step is recorded: its bucket, the
sequences in it, and whether a plan was built. Checks:

* builds == the number of distinct buckets used, and no step in a bucket
  already built builds again, whatever joined, left, finished or was refused;
* the schedule did exercise that: some step inside a built bucket has another
  row set than the step before it (a join or a leave), and the batch moved
  between buckets;
* both halves of the bucket key: a held bucket plan's key judges its own
  bucket VALID and every other bucket's live key not VALID;
* replan builds once per batched step.

The negative control injects REBUILD_ON_JOIN (the plan keyed on which
sequences are live: a rebuild on every join or leave, invisible in logits).
"""
from __future__ import annotations

import dataclasses

from fuelpipe.driver import live_key
from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.kv.batch import BucketView
from fuelpipe.oracles.base import OracleInput, OracleResult
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.oracles.batch_runs import batcher, schedule
from fuelpipe.plan.validity import PlanValidity

ACCOUNTING_TOKENS = 12  # per request (plus the schedule's stagger): joins, leaves and bucket moves all happen
REPLAN_TOKENS = 4  # replan builds every step; a short run shows it


def _recorded(inp: OracleInput, plan: PlanMode, fault: Fault, tokens: int):
    """Serve the schedule; per batched step (bucket, row ids, builds during it)."""
    sched = schedule(inp, min_tokens=tokens)
    sched = dataclasses.replace(sched, requests=tuple(
        dataclasses.replace(r, max_new_tokens=tokens + r.max_new_tokens % 4) for r in sched.requests))
    ctx = inp.setup.context(inp.model, plan=plan, fault=fault)
    b = batcher(inp, sched.capacity, ctx=ctx)
    steps = []
    step = b.decoder.step

    def recorded(rows, tokens_):
        before = b.decoder.builds
        out = step(rows, tokens_)
        steps.append((b.decoder.spec.bucket_for(len(rows)), tuple(id(r) for r in rows), b.decoder.builds - before))
        return out

    b.decoder.step = recorded
    b.submit(sched.requests[0])
    refused = b.submit(sched.refused)
    results = b.run(sched.requests[1:])
    return b, steps, results, refused


def run(inp: OracleInput) -> OracleResult:
    b, steps, results, refused = _recorded(inp, PlanMode.plan_once, inp.fault, ACCOUNTING_TOKENS)
    problems = []
    seen: set[int] = set()
    moved_inside = 0
    for i, (bucket, rows, built) in enumerate(steps):
        if bucket in seen and built:
            what = "a join or leave" if i and steps[i - 1][1] != rows else "nothing"
            problems.append(f"step {i}: bucket {bucket} (already built) built again after {what}")
        if bucket in seen and i and steps[i - 1][0] == bucket and steps[i - 1][1] != rows:
            moved_inside += 1
        seen.add(bucket)
    builds = b.decoder.builds
    if builds != len(seen):
        problems.append(f"{builds} builds for {len(seen)} buckets used {sorted(seen)}")
    if not moved_inside:
        problems.append("the schedule never changed the rows inside a built bucket: nothing was checked")
    if len(seen) < 2:
        problems.append(f"the schedule used one bucket only ({sorted(seen)}): the bucket key was never exercised")
    if refused.finish != "refused":
        problems.append(f"the too-long request ended {refused.finish!r}, expected refused")
    failed = [r.request.name for r in results if r is not refused and r.finish not in ("length", "stop")]
    if failed:
        problems.append(f"requests {failed} did not finish")
    # Both halves of the bucket key, on the held plans.
    model, kv = inp.model, b.kv
    verdicts = 0
    for bucket, plan in b.decoder.plans.items():
        if plan.session is None:
            continue
        for other in b.decoder.spec.buckets:
            key = live_key(model, BucketView(kv, other), 1, policy_for(inp.fault))
            verdict = plan.session.validity_for(key)
            verdicts += 1
            if (other == bucket) != (verdict is PlanValidity.VALID):
                problems.append(f"bucket {bucket}'s plan judged bucket {other} {verdict.value}")
    rb, rsteps, _, _ = _recorded(inp, PlanMode.replan, Fault.NONE, REPLAN_TOKENS)
    if rb.decoder.builds != len(rsteps):
        problems.append(f"replan built {rb.decoder.builds} plans over {len(rsteps)} batched steps")
    d = b.describe()
    return OracleResult(
        name="batch_plan_accounting",
        passed=not problems,
        metric={"steps": len(steps), "buckets_used": sorted(seen), "builds": builds,
                "builds_per_bucket": d["builds_per_bucket"], "row_changes_inside_bucket": moved_inside,
                "validity_verdicts": verdicts, "plans_held": d["plans_held"],
                "plan_buffer_bytes": d["plan_buffer_bytes"], "replan_builds": rb.decoder.builds,
                "replan_steps": len(rsteps), "violations": len(problems)},
        tolerance=None,
        detail="; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
        if problems else
        f"{builds} builds for buckets {sorted(seen)} over {len(steps)} steps ({moved_inside} row changes inside a "
        f"bucket, a refused request, no rebuild); each held plan VALID only for its own bucket; replan "
        f"{rb.decoder.builds} builds / {len(rsteps)} steps",
    )
