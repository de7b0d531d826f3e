"""The decode path against the model's eager no-cache reference, within a max-abs tolerance.

``model.reference_logits(ids)`` recomputes every position from scratch with
no KV cache, no plan and no fused projection, so a cache write that never
happened, a wrong offset or a bad fusion all show up here. The tolerance is
per model dtype (experiment.oracles.vs_reference.tolerance) and is absolute for
logits of magnitude up to 1; beyond that it scales with the largest reference
logit, because float accumulation error grows with the values summed (a real
30-layer checkpoint's logits reach ~20; a tiny random model's stay below 1,
where the bound is exactly the configured one). The negative
control injects NAIVE_DCE (torch.fx's default dead-code elimination, which
drops in-place KV writes whose result is unused); it needs the fx backend and
the symbol offset path, where the write has no data dependency.
"""
from __future__ import annotations

import torch

from fuelpipe.oracles.base import OracleInput, OracleResult, compare_scaled, greedy_run


def run(inp: OracleInput) -> OracleResult:
    prompt = inp.prompts[0]
    ctx = inp.setup.context(inp.model, fault=inp.fault)
    tokens, got = greedy_run(ctx, inp.cache(ctx), prompt, inp.new_tokens)
    ids = torch.tensor([list(prompt) + tokens[:-1]], dtype=torch.int64, device=ctx.device)
    want = list(inp.model.reference_logits(ids)[0, len(prompt) - 1 :])  # one row per generated token
    worst, first, scale, allowed = compare_scaled(want, got, inp.tolerance)
    return OracleResult(
        name="vs_reference",
        passed=first is None,
        metric={"max_abs_error": worst, "first_divergent_step": first, "steps": len(got), "logit_scale": scale},
        tolerance=inp.tolerance,
        detail=f"max |logits - reference_logits| over {len(got)} tokens, {ctx.plan.mode.value} on "
        f"{ctx.plan.spec.name} ({ctx.offset_mode} offsets), allowed {inp.tolerance:g} x logit scale "
        f"{scale:.3g} = {allowed:.3g}",
    )
