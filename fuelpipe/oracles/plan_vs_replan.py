"""plan_once against replan: bit-identical logits over the decode tokens.

The replan arm builds a fresh program every token, so it has no held state to
go stale; the plan_once arm reuses one program and rebinds per-token data.
Both arms decode the same forced token stream on the same model. The
negative control injects STALE_OFFSET into the plan_once arm (the held plan
keeps the write offset it was built with).
"""
from __future__ import annotations

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.base import OracleInput, OracleResult, compare, forced_logits, greedy_run


def run(inp: OracleInput) -> OracleResult:
    prompt = inp.prompts[0]
    replan = inp.setup.context(inp.model, plan=PlanMode.replan)
    tokens, want = greedy_run(replan, inp.cache(replan), prompt, inp.new_tokens)
    held = inp.setup.context(inp.model, plan=PlanMode.plan_once, fault=inp.fault)
    got = forced_logits(held, inp.cache(held), prompt, tokens)
    worst, first = compare(want, got)
    return OracleResult(
        name="plan_vs_replan",
        passed=first is None,
        metric={"max_abs_error": worst, "first_divergent_step": first, "steps": len(got)},
        tolerance=0.0,
        detail=f"torch.equal of plan_once and replan logits over {len(got)} tokens "
        f"(plan_once builds: {held.plan.stats.builds}, replan builds: {replan.plan.stats.builds})",
    )
