"""backend=aot: the held step compiled ahead of time (AOTInductor) and bound to the model's own weights.

Each plan build here is an AOTInductor compile of the tiny model's layer program (~10 s on 2 cores, private:
no plan cache), so the tests that build are ``slow`` (their own CI step); the config checks run by default.
tests/plan/test_layered_aot.py covers the default build, with a store, in the default run.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fuelpipe.config.validate import validate
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.execute import execute
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from models.registry import build_random_model

SHORT = ["experiment.new_tokens=3", "backend.threads=1"]


def test_aot_refuses_host_integer_offsets(compose_cfg):
    reasons = validate(compose_cfg(["backend=aot", "plan.offset_mode=symbol"]))
    assert any("backend=aot compiles the step ahead of time" in r and "plan.offset_mode=tensor" in r for r in reasons)
    assert validate(compose_cfg(["backend=aot"])) == []


def test_aot_is_a_registered_backend_that_stores_plans(compose_cfg):
    from fuelpipe.plan.backends import BACKENDS

    entry = BACKENDS.get("aot")
    assert entry.ahead_of_time and entry.stores_plans and entry.prompt_compiler is not None
    assert not BACKENDS.get("inductor").ahead_of_time  # torch.compile takes host integers as symbols


def _decode(ctx, tokens=(4, 5, 6, 7)):
    cache = ctx.new_cache(32)
    rows = [ctx.prefill(cache, [1, 2, 3])]
    rows += [ctx.decode(cache, t) for t in tokens]
    return torch.cat(rows)


@pytest.mark.slow
def test_aot_plan_computes_the_reference_on_the_models_own_weights(threads):
    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    ctx = InferenceContext(model, "aot", "plan_once")
    got = _decode(ctx)
    want = _decode(InferenceContext(model, "eager", "plan_once"))
    assert (got - want).abs().max().item() <= 1e-5
    program = ctx.plan.session.program
    assert program.backend == "aot" and ctx.plan.stats.builds == 1  # one compile, reused for every token
    assert program.cache_event.status == "private" and program.cache_event.compile_s > 0
    # The programs hold no weights of their own: a weight holding a parameter's values is that parameter,
    # by address (the rest are the plan's derived copies, e.g. fused q/k/v, held by the plan, not the package).
    calls = [m for name, m in program.fn._run.named_children() if name.startswith("layer_")]
    bound = [w for call in calls for w in call.weights]
    params = list(model.parameters())
    addresses = {p.data_ptr() for p in params}
    by_address = [t for t in bound if t.data_ptr() in addresses]
    copies = [t for t in bound if t.data_ptr() not in addresses
              and any(t.shape == p.shape and torch.equal(t, p) for p in params)]
    assert len(by_address) >= 8 and not copies


@pytest.mark.slow
def test_vs_reference_catches_misbound_aot_weights(compose_cfg):
    """The AOT path's own negative control: its weights bound to the wrong names must fail vs_reference."""
    cfg = compose_cfg([*SHORT, "backend=aot"])
    asm = assemble(cfg)
    healthy = run_one(cfg, asm, ORACLES["vs_reference"])
    assert healthy.passed and healthy.setup["backend"] == "aot", healthy.detail
    spec = dataclasses.replace(ORACLES["vs_reference"], fault=Fault.AOT_CONSTANTS_MISBOUND, fault_setup=lambda s: s)
    control = execute(spec, model=asm.model, setup=asm.setup, prompts=asm.prompts, new_tokens=3,
                      max_seq_len=asm.max_seq_len, other_model=asm.other_model, tolerance=healthy.tolerance,
                      control=True)
    assert not control.passed and control.fault == Fault.AOT_CONSTANTS_MISBOUND.value, control.detail
    assert not control.detail.startswith("raised"), control.detail
    assert control.metric["max_abs_error"] > 1e-3


@pytest.mark.slow
# (key_sensitivity on aot also passes and catches its fault, but builds ~20 plans: 6 min here)
@pytest.mark.parametrize("name", ["plan_vs_replan"])
def test_oracle_on_aot_passes_then_catches_its_fault(compose_cfg, name):
    healthy = run_one(cfg := compose_cfg([*SHORT, "backend=aot"]), assemble(cfg), ORACLES[name])
    assert healthy.passed and healthy.setup["backend"] == "aot", healthy.detail
    cfg = compose_cfg([*SHORT, "backend=aot", f"experiment.oracles.{name}.inject_fault=true"])
    control = run_one(cfg, assemble(cfg), ORACLES[name])
    assert not control.passed and control.fault == ORACLES[name].fault.value, control.detail
    assert not control.detail.startswith("raised"), control.detail


@pytest.mark.slow
def test_aot_with_a_plan_cache_stores_then_loads_the_same_plan(tmp_path, threads):
    from fuelpipe.plan.backends import BackendSpec
    from fuelpipe.plan.plan_store import PlanCacheSpec

    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    runs = []
    for _ in range(2):  # two contexts: the second build must be served from the folder
        ctx = InferenceContext(model, BackendSpec(name="aot", plan_cache=PlanCacheSpec(dir=str(tmp_path))))
        runs.append((_decode(ctx), ctx.plan.session.program))
    (first, built), (second, loaded) = runs
    assert built.backend == loaded.backend == "aot"
    assert built.cache_event.status == "miss" and loaded.cache_event.status == "hit"
    assert torch.equal(first, second)
    assert (first - _decode(InferenceContext(model, "eager", "plan_once"))).abs().max().item() <= 1e-5
