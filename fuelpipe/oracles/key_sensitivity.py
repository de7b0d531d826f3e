"""What the plan key reuses, rebinds and rebuilds, checked end to end on plan_once: both halves.

Must NOT rebuild (invalidating too readily throws the speedup away):
* a matching key is reused (Valid, no build, realize_count advances);
* a new cache allocation is AllocationChanged and is rebound, not rebuilt,
  and its logits equal a solo run bit-exactly.

Must rebuild (reusing too readily serves a wrong answer at full speed), and the
rebuilt plan's logits must equal a fresh context's on the changed model:
* a different model instance of the same config (other weights);
* deep-copy twins: two ``copy.deepcopy`` copies of one model, the second
  reloaded with other values, the first's plan asked to serve the second;
* each of ``weight_mutations.MUTATIONS`` on a held plan's own model:
  ``copy_``, ``.data =``, a replaced submodule, ``load_state_dict``.
Mutations run on private deep copies; the model under test is never changed.
Where the family's class can be rebuilt from its config (``cls(config, device=,
dtype=)``), each rebuilt plan is also compared with a fresh plan on a *clean
instance* loaded from the state dict: a fresh context on the same object (or a
deep copy) would share any derived weight the model memoised outside its module
tree, and miss it going stale.

The negative control injects IGNORE_MODEL_IDENTITY (the key drops the model's
structure and weight identity), so a held plan serves changed or other weights.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.base import OracleInput, OracleResult, compare
from fuelpipe.oracles.checks import Check
from fuelpipe.oracles.weight_mutations import MUTATIONS, scaled_state
from fuelpipe.plan.validity import PlanValidity
from fuelpipe.sampling import greedy


def _solo(inp: OracleInput, model, decode_tokens: list[int]) -> list[torch.Tensor]:
    """Logits rows of a fresh context: the prefill's, then one per decoded token."""
    ctx = inp.setup.context(model, plan=PlanMode.plan_once)
    cache = inp.cache(ctx)
    return [ctx.prefill(cache, list(inp.prompts[0]))[0]] + [ctx.decode(cache, t)[0] for t in decode_tokens]


def clean_instance(model):
    """A new instance of the model's class from its config, loaded with its state dict, or None.

    Nothing Python-side is carried over (a deep copy would carry a derived weight memoised in
    ``__dict__``), so its fresh plan is what the weights alone compute. A class that is not
    built as ``cls(config, device=, dtype=)`` (the ``FamilyEntry`` contract) gives None.
    """
    first = next(iter(model.parameters()), None)
    config = getattr(model, "config", None)
    if first is None or config is None:
        return None
    try:
        clean = type(model)(config, device=first.device, dtype=first.dtype)
        clean.load_state_dict(model.state_dict())
    except (TypeError, RuntimeError):
        return None
    return clean


def _clean_check(inp: OracleInput, name: str, model, decode_tokens: list[int], got: list[torch.Tensor]) -> list[Check]:
    """``got`` against a fresh plan on a clean instance (see ``clean_instance``); no check without one."""
    clean = clean_instance(model)
    if clean is None:
        return []
    worst, first_bad = compare(_solo(inp, clean, decode_tokens)[-len(got):], got)
    return [Check(f"{name}: logits equal a clean instance's", first_bad is None, f"max abs {worst:g}", worst)]


def _reuse_and_rebind(inp: OracleInput, prompt: list[int]) -> list[Check]:
    ctx = inp.setup.context(inp.model, plan=PlanMode.plan_once, fault=inp.fault)
    stats = ctx.plan.stats
    first = inp.cache(ctx)
    t0 = greedy(ctx.prefill(first, prompt))
    t1 = greedy(ctx.decode(first, t0))  # builds the held plan
    ctx.decode(first, t1)
    checks = [Check(
        "matching key reused",
        stats.last_validity is PlanValidity.VALID and stats.builds == 1 and ctx.plan.session.realize_count == 1,
        f"validity={_v(stats.last_validity)} builds={stats.builds} realize_count={ctx.plan.session.realize_count}",
    )]
    second = inp.cache(ctx)
    got = [ctx.prefill(second, prompt)[0], ctx.decode(second, t0)[0]]
    checks.append(Check(
        "new allocation rebound, not rebuilt",
        stats.last_validity is PlanValidity.ALLOCATION_CHANGED and stats.builds == 1 and stats.rebinds == 1,
        f"validity={_v(stats.last_validity)} builds={stats.builds} rebinds={stats.rebinds}",
    ))
    worst, first_bad = compare(_solo(inp, inp.model, [t0]), got)
    checks.append(Check("rebound logits equal a solo run", first_bad is None, f"max abs {worst:g}", worst))
    return checks


def _served_by_held_plan(inp: OracleInput, held_model, other_model, prompt: list[int], name: str) -> list[Check]:
    """A plan built on ``held_model`` is asked to serve ``other_model``: stale, rebuilt, other's own answer."""
    ctx = inp.setup.context(held_model, plan=PlanMode.plan_once, fault=inp.fault)
    cache = inp.cache(ctx)
    t0 = greedy(ctx.prefill(cache, prompt))
    ctx.decode(cache, t0)  # builds the held plan
    other_ctx = inp.setup.context(other_model, plan=PlanMode.plan_once, fault=inp.fault)
    other_ctx.plan = ctx.plan  # the held plan now meets a model it was not built for
    stats = ctx.plan.stats
    third = inp.cache(other_ctx)
    got = [other_ctx.prefill(third, prompt)[0], other_ctx.decode(third, t0)[0]]
    worst, first_bad = compare(_solo(inp, other_model, [t0]), got)
    return [
        Check(f"{name}: stale and rebuilt", stats.last_validity is PlanValidity.STALE and stats.builds == 2,
              f"validity={_v(stats.last_validity)} builds={stats.builds}"),
        Check(f"{name}: logits equal its solo run", first_bad is None, f"max abs {worst:g}", worst),
    ] + _clean_check(inp, name, other_model, [t0], got)


def _mutated_under_plan(inp: OracleInput, prompt: list[int]) -> list[Check]:
    """Every mutation in turn on one private copy under one held context: each must be seen and rebuilt."""
    model = copy.deepcopy(inp.model)  # private: the model under test is never changed
    ctx = inp.setup.context(model, plan=PlanMode.plan_once, fault=inp.fault)
    stats = ctx.plan.stats
    first = inp.cache(ctx)
    t0 = greedy(ctx.prefill(first, prompt))
    before = ctx.decode(first, t0)[0]  # builds the held plan
    checks = []
    for name, mutate in MUTATIONS.items():
        builds = stats.builds
        what = mutate(model)
        cache = inp.cache(ctx)
        ctx.prefill(cache, prompt)
        got = ctx.decode(cache, t0)[0]
        want = _solo(inp, model, [t0])[1]
        worst, first_bad = compare([want], [got])
        checks += [
            Check(f"{name}: the mutation changes the logits", not torch.equal(before, want),
                  f"{what}; max abs change {float((before - want).abs().max()):g}"),
            Check(f"{name}: stale and rebuilt", stats.last_validity is PlanValidity.STALE and stats.builds == builds + 1,
                  f"validity={_v(stats.last_validity)} builds={stats.builds - builds}"),
            Check(f"{name}: logits equal a fresh plan's", first_bad is None, f"max abs {worst:g}", worst),
        ] + _clean_check(inp, name, model, [t0], [got])
        before = want
    return checks


def _deepcopy_twins(inp: OracleInput) -> tuple:
    """Two deep copies of the model; the second reloaded with other values (equal version counts)."""
    a, b = copy.deepcopy(inp.model), copy.deepcopy(inp.model)
    a.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    b.load_state_dict(scaled_state(b))
    return a, b


def run(inp: OracleInput) -> OracleResult:
    prompt = list(inp.prompts[0])
    checks = _reuse_and_rebind(inp, prompt)
    checks += _served_by_held_plan(inp, inp.model, inp.other_model(), prompt, "other model instance")
    checks += _served_by_held_plan(inp, *_deepcopy_twins(inp), prompt, "deep-copy twin")
    checks += _mutated_under_plan(inp, prompt)
    failed = [f"{c.name} ({c.seen})" for c in checks if not c.ok]
    return OracleResult(
        name="key_sensitivity",
        passed=not failed,
        metric={
            "checks": len(checks),
            "failed_checks": len(failed),
            "max_abs_error": max(c.error for c in checks),
            "mutations": list(MUTATIONS),
        },
        tolerance=None,
        detail="failed: " + "; ".join(failed) if failed else "; ".join(f"{c.name}: {c.seen}" for c in checks),
    )


def _v(validity: Optional[PlanValidity]) -> str:
    return "none" if validity is None else validity.value
