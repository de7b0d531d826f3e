"""Every oracle passes on the healthy runtime and FAILS under its own negative control."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import default_or_slow
from fuelpipe.errors import ConfigError
from fuelpipe.oracles.base import compare
from fuelpipe.oracles.registry import ORACLES, oracle
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one

SHORT = ["experiment.new_tokens=4"]


def _run(compose_cfg, name, overrides=()):
    cfg = compose_cfg([*SHORT, *overrides])
    return run_one(cfg, assemble(cfg), ORACLES[name])


# quant_quality skips f32 weights: its gate and negative control run in tests/quant/test_quant.py. (plan_cache
# checks its content key on every backend; its stored plans run in tests/plan/test_plan_cache.py.)
OWN_TESTS = ("quant_quality",)
CASES = [(name, backend) for name in sorted(ORACLES) if name not in OWN_TESTS for backend in ("eager", "fx")]
# Every oracle on fx by default; on eager too with -m slow (each oracle's own tests cover eager).
DEFAULT = [(name, "fx") for name in ORACLES if name not in OWN_TESTS] + [(name, "eager") for name in ("plan_vs_replan", "key_sensitivity")]


@pytest.mark.parametrize("name,backend", default_or_slow(CASES, DEFAULT, [f"{n}-{b}" for n, b in CASES]))
def test_oracle_passes_then_catches_its_fault(compose_cfg, name, backend):
    healthy = _run(compose_cfg, name, [f"backend={backend}"])
    assert healthy.passed, healthy.detail
    assert not healthy.negative_control and healthy.fault == "none"

    control = _run(compose_cfg, name, [f"backend={backend}", f"experiment.oracles.{name}.inject_fault=true"])
    assert not control.passed, f"{name} did not catch {ORACLES[name].fault.value}: {control.detail}"
    assert control.negative_control and control.fault == ORACLES[name].fault.value
    assert not control.detail.startswith("raised"), "the fault must be caught by the check, not by a crash"


def test_negative_control_flag_injects_only_into_enabled_oracles(compose_cfg):
    cfg = compose_cfg([*SHORT, "backend=eager", "experiment.negative_control=true"])
    asm = assemble(cfg)
    results = {name: run_one(cfg, asm, spec) for name, spec in ORACLES.items()}
    assert all(r.negative_control and not r.passed for r in results.values())


def test_faults_localise_the_divergence(compose_cfg):
    stale = _run(compose_cfg, "plan_vs_replan", ["experiment.oracles.plan_vs_replan.inject_fault=true"])
    # step 0 is the prefill, step 1 the build token; the stale offset shows on the first reused token
    assert stale.metric["first_divergent_step"] == 2 and stale.metric["max_abs_error"] > 0
    dce = _run(compose_cfg, "vs_reference", ["backend=eager", "experiment.oracles.vs_reference.inject_fault=true"])
    assert dce.setup == {"backend": "fx", "plan": "plan_once", "offset_mode": "symbol", "kv": "contiguous"}
    assert dce.metric["first_divergent_step"] == 1  # the build token already lost its KV writes
    accounting = _run(compose_cfg, "plan_accounting", ["experiment.oracles.plan_accounting.inject_fault=true"])
    assert accounting.metric["plan_once_builds"] == 3 and accounting.metric["plan_once_realize_count"] == 0


def test_accounting_records_one_build_and_one_realize_per_reused_token(compose_cfg):
    result = _run(compose_cfg, "plan_accounting", ["experiment.new_tokens=6"])
    assert result.metric == {
        "decode_tokens": 5, "plan_once_builds": 1, "plan_once_realize_count": 4, "replan_builds": 5,
        "node_count": result.metric["node_count"], "violations": 0,
    }
    assert result.metric["node_count"] > 0  # fx reports its graph size


@pytest.mark.parametrize("dtype, tolerance, passes", [
    ("float32", 1e-5, True), ("float32", 1e-9, False), ("bfloat16", 2e-2, True), ("bfloat16", 1e-6, False),
])
def test_vs_reference_applies_the_dtype_tolerance(compose_cfg, dtype, tolerance, passes):
    result = _run(compose_cfg, "vs_reference", [
        "backend=eager", f"model.dtype={dtype}", f"experiment.oracles.vs_reference.tolerance.{dtype}={tolerance}",
    ])
    assert result.tolerance == tolerance
    assert result.passed is passes, result.metric


def test_compare_is_bit_exact_or_within_atol():
    a = torch.tensor([1.0, 2.0, 3.0])
    b = a.clone()
    b[1] = torch.nextafter(b[1], torch.tensor(3.0))  # one ulp
    assert compare([a, a], [a, a]) == (0.0, None)
    worst, first = compare([a, a], [a, b])
    assert first == 1 and 0 < worst < 1e-6
    assert compare([a, a], [a, b], atol=1e-6) == (worst, None)
    nan = a.clone()
    nan[0] = float("nan")
    worst, first = compare([a], [nan], atol=1.0)
    assert first == 0 and math.isinf(worst)


def test_unknown_oracle_name_suggests_the_nearest():
    with pytest.raises(ConfigError, match=r"did you mean 'plan_accounting'\? available: (\w+, )*key_sensitivity, "):
        oracle("plan_acounting")
