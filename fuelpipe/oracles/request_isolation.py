"""Two requests on one context, decoded interleaved token by token, equal their solo runs.

Each request has its own cache; the context's one held plan follows the
cache it is asked to serve (rebind on every switch under plan_once). Each
request is forced to its solo run's tokens and compared bit-exactly. The
negative control injects IGNORE_ALLOCATION on plan_once (the key ignores
which cache the plan is bound to), so request B is served A's KV.
"""
from __future__ import annotations

from fuelpipe.oracles.base import OracleInput, OracleResult, compare, greedy_run


def run(inp: OracleInput) -> OracleResult:
    prompts = inp.prompts[:2]
    solo = []
    for prompt in prompts:
        ctx = inp.setup.context(inp.model)
        solo.append(greedy_run(ctx, inp.cache(ctx), prompt, inp.new_tokens))
    shared = inp.setup.context(inp.model, fault=inp.fault)
    caches = [inp.cache(shared) for _ in prompts]
    got = [[shared.prefill(c, list(p))[0]] for c, p in zip(caches, prompts)]
    for step in range(inp.new_tokens - 1):
        for r, cache in enumerate(caches):
            got[r].append(shared.decode(cache, solo[r][0][step])[0])
    results = [compare(logits, rows) for (_, logits), rows in zip(solo, got)]
    worst = max(w for w, _ in results)
    diverged = [(r, f) for r, (_, f) in enumerate(results) if f is not None]
    first = min((f for _, f in diverged), default=None)
    return OracleResult(
        name="request_isolation",
        passed=not diverged,
        metric={"max_abs_error": worst, "first_divergent_step": first, "requests_diverged": len(diverged)},
        tolerance=0.0,
        detail=f"2 requests interleaved on one {shared.plan.mode.value} context vs solo runs, torch.equal over "
        f"{inp.new_tokens} tokens each (builds {shared.plan.stats.builds}, rebinds {shared.plan.stats.rebinds})"
        + ("; diverged: " + ", ".join(f"request {r} at step {f}" for r, f in diverged) if diverged else ""),
    )
