"""What the plan key reuses, rebinds and rebuilds, checked end to end on plan_once.

* a matching key is reused (Valid, no build, realize_count advances);
* a new cache allocation is AllocationChanged and is rebound, not rebuilt,
  and its logits equal a solo run bit-exactly;
* a different model instance of the same config (other weights) is Stale and
  rebuilt, and its logits equal that model's solo run bit-exactly.

The negative control injects IGNORE_MODEL_IDENTITY (the key drops the model
identity), so the held plan serves the other model with the first one's
weights.
"""
from __future__ import annotations

from fuelpipe.driver import PlanMode
from fuelpipe.oracles.base import OracleInput, OracleResult, compare
from fuelpipe.plan.validity import PlanValidity
from fuelpipe.sampling import greedy


def _solo(inp: OracleInput, model, decode_tokens: list[int]):
    """Logits rows of a fresh context: the prefill's, then one per decoded token."""
    ctx = inp.setup.context(model, plan=PlanMode.PLAN_ONCE)
    cache = inp.cache(ctx)
    return [ctx.prefill(cache, list(inp.prompts[0]))[0]] + [ctx.decode(cache, t)[0] for t in decode_tokens]


def run(inp: OracleInput) -> OracleResult:
    prompt = list(inp.prompts[0])
    ctx = inp.setup.context(inp.model, plan=PlanMode.PLAN_ONCE, fault=inp.fault)
    stats = ctx.plan.stats
    checks: list[tuple[str, bool, str]] = []

    first = inp.cache(ctx)
    t0 = greedy(ctx.prefill(first, prompt))
    t1 = greedy(ctx.decode(first, t0))  # builds the held plan
    ctx.decode(first, t1)
    checks.append((
        "matching key reused",
        stats.last_validity is PlanValidity.VALID and stats.builds == 1 and ctx.plan.session.realize_count == 1,
        f"validity={_v(stats.last_validity)} builds={stats.builds} realize_count={ctx.plan.session.realize_count}",
    ))

    second = inp.cache(ctx)
    got = [ctx.prefill(second, prompt)[0], ctx.decode(second, t0)[0]]
    checks.append((
        "new allocation rebound, not rebuilt",
        stats.last_validity is PlanValidity.ALLOCATION_CHANGED and stats.builds == 1 and stats.rebinds == 1,
        f"validity={_v(stats.last_validity)} builds={stats.builds} rebinds={stats.rebinds}",
    ))
    worst_alloc, first_alloc = compare(_solo(inp, inp.model, [t0]), got)
    checks.append(("rebound logits equal a solo run", first_alloc is None, f"max abs {worst_alloc:g}"))

    other = inp.other_model()
    other_ctx = inp.setup.context(other, plan=PlanMode.PLAN_ONCE, fault=inp.fault)
    other_ctx.plan = ctx.plan  # the held plan now meets a model it was not built for
    third = inp.cache(other_ctx)
    o0 = greedy(other_ctx.prefill(third, prompt))
    got = [other_ctx.decode(third, o0)[0]]
    checks.append((
        "other model instance is stale and rebuilt",
        stats.last_validity is PlanValidity.STALE and stats.builds == 2,
        f"validity={_v(stats.last_validity)} builds={stats.builds}",
    ))
    worst_model, first_model = compare(_solo(inp, other, [o0])[1:], got)
    checks.append(("other model's logits equal its solo run", first_model is None, f"max abs {worst_model:g}"))

    failed = [f"{name} ({seen})" for name, ok, seen in checks if not ok]
    return OracleResult(
        name="key_sensitivity",
        passed=not failed,
        metric={
            "checks": len(checks),
            "failed_checks": len(failed),
            "max_abs_error": max(worst_alloc, worst_model),
        },
        tolerance=None,
        detail="failed: " + "; ".join(failed) if failed else "; ".join(f"{n}: {s}" for n, _, s in checks),
    )


def _v(validity) -> str:
    return "none" if validity is None else validity.value
