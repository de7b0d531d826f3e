"""Untimed check beside the peers table: does each plan_once row compute the same bits as its replan row?

The table's ``tokens = ref`` compares greedy ids only. Here both rows of one fuelpipe configuration
(backend, KV layout, model) run the same prompt and the same forced tokens once more, after the timed
runs, and every logit row (the prompt's last, then each decode step's) is compared with
``torch.equal``. A plan that is held must not change what is computed, not even in the last bit.
"""
from __future__ import annotations

from typing import Optional

import torch

from fuelpipe.bench.peers.systems import FuelpipeSystem


def logit_rows(system: FuelpipeSystem, prompt: list[int], steps: int,
               tokens: Optional[list[int]] = None) -> list[torch.Tensor]:
    """[vocab] f32 per row, on a new allocation: prefill ``prompt``, then ``steps`` decode steps feeding
    ``tokens`` (greedy from the previous row when None)."""
    cache = system.kv.new_cache(system.ctx, len(prompt) + steps)
    out = [system.ctx.prefill(cache, prompt)[0].clone()]
    for i in range(steps):
        tok = tokens[i] if tokens is not None else int(torch.argmax(out[-1]))
        out.append(system.ctx.decode(cache, tok)[0].clone())
    return out


def compare_plan_once_to_replan(once: FuelpipeSystem, replan: FuelpipeSystem, prompt: list[int],
                                steps: int) -> dict:
    """Greedy ``steps`` decode steps on ``once``; the same forced tokens on ``replan``; logits compared."""
    a = logit_rows(once, prompt, steps)
    b = logit_rows(replan, prompt, steps, [int(torch.argmax(row)) for row in a[:-1]])
    equal = [torch.equal(x, y) for x, y in zip(a, b)]
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    return {"steps": len(a), "bit_identical": all(equal), "rows_differing": equal.count(False),
            "max_abs_diff": worst}


def plan_bits(systems: list, prompt: list[int], steps_for) -> dict[str, dict]:
    """For each plan_once fuelpipe row with a replan twin: {plan_once row name: comparison}.

    ``steps_for(backend)``: how many decode steps to compare (the replan row's own cap: building a
    program per token is what makes replan slow)."""
    by_name = {s.name: s for s in systems if isinstance(s, FuelpipeSystem) and not s.missing}
    out = {}
    for name, once in by_name.items():
        if once.plan != "plan_once":
            continue
        twin = by_name.get(name.replace(" plan_once ", " replan "))
        if twin is None or twin.model is not once.model:
            continue
        out[name] = compare_plan_once_to_replan(once, twin, prompt, steps_for(once.backend.name))
    return out
