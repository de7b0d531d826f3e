"""How many plans a generation builds, and how often the held one is reused.

plan_once: exactly one build for the whole generation, ``realize_count``
advancing by exactly one per reused token, and a node count that is the same
on every token from the second decode token on. replan: one build per decode
token. The negative control injects REBUILD_EVERY_TOKEN (plan_once silently
rebuilds: over-keying, a performance bug no logit comparison can see).
"""
from __future__ import annotations

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult
from fuelpipe.sampling import greedy


def _decode_steps(inp: OracleInput, mode: PlanMode, fault: Fault):
    """Per decode step: (builds, realize_count or None, node_count)."""
    ctx = inp.setup.context(inp.model, plan=mode, fault=fault)
    cache = inp.cache(ctx)
    logits = ctx.prefill(cache, list(inp.prompts[0]))
    steps = []
    for _ in range(inp.new_tokens - 1):
        logits = ctx.decode(cache, greedy(logits))
        session = ctx.plan.session
        steps.append(
            (ctx.plan.stats.builds, None if session is None else session.realize_count,
             None if session is None else session.node_count)
        )
    return steps


def run(inp: OracleInput) -> OracleResult:
    held = _decode_steps(inp, PlanMode.plan_once, inp.fault)
    replan = _decode_steps(inp, PlanMode.replan, Fault.NONE)  # the fault targets plan_once's reuse
    problems = []
    for i, (builds, realized, _) in enumerate(held):
        if builds != 1:
            problems.append(f"plan_once decode token {i}: {builds} builds so far, expected 1")
        if realized != i:
            problems.append(f"plan_once decode token {i}: realize_count {realized}, expected {i}")
    nodes = [n for _, _, n in held]
    if len(set(nodes[1:])) > 1:
        problems.append(f"plan_once node count changes after the second decode token: {nodes}")
    for i, (builds, _, _) in enumerate(replan):
        if builds != i + 1:
            problems.append(f"replan decode token {i}: {builds} builds so far, expected {i + 1}")
    n = len(held)
    return OracleResult(
        name="plan_accounting",
        passed=not problems,
        metric={
            "decode_tokens": n,
            "plan_once_builds": held[-1][0],
            "plan_once_realize_count": held[-1][1],
            "replan_builds": replan[-1][0],
            "node_count": nodes[-1],
            "violations": len(problems),
        },
        tolerance=None,
        detail="; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
        if problems
        else f"plan_once: 1 build, realize_count 0..{n - 1}, node count {nodes[-1]}; replan: {n} builds",
    )
