"""The three batch oracles on every family x KV strategy: each passes, and each fails under its own fault."""
import pytest

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from conftest import default_or_slow

CASES = [("llama_tiny", "contiguous", "tensor"), ("llama_tiny", "paged", "symbol"), ("phi_tiny", "contiguous", "symbol"),
         ("phi_tiny", "paged", "tensor"), ("qwen3_tiny", "contiguous", "tensor"), ("qwen3_tiny", "paged", "tensor"),
         ("gemma3_tiny", "contiguous", "symbol"), ("gemma3_tiny", "paged", "tensor"),
         ("deepseek_v2_tiny", "latent", "tensor"), ("deepseek_v2_tiny_dense", "latent", "tensor")]
# llama contiguous runs in test_oracles_controls; gemma3's per-row windows in test_batch_decode.
KEEP = [("llama_tiny", "paged", "symbol"), ("deepseek_v2_tiny", "latent", "tensor")]
ORACLE_NAMES = ("batch_vs_solo", "batch_isolation", "batch_plan_accounting")
SMALL = ["batch.max_batch=4", "batch.buckets=[1,2,4]", "experiment.new_tokens=6"]


def _run(compose_cfg, overrides, name):
    cfg = compose_cfg(overrides)
    return run_one(cfg, assemble(cfg), ORACLES[name])


@pytest.mark.parametrize("model,kv,offset", default_or_slow(CASES, KEEP))
@pytest.mark.parametrize("name", ORACLE_NAMES)
def test_batch_oracle_passes_and_its_control_fails(compose_cfg, model, kv, offset, name):
    base = [f"model={model}", f"kv={kv}", f"plan.offset_mode={offset}", *SMALL]
    healthy = _run(compose_cfg, base, name)
    assert healthy.passed, healthy.detail
    control = _run(compose_cfg, [*base, f"experiment.oracles.{name}.inject_fault=true"], name)
    assert not control.passed, f"{name}'s negative control passed: {control.detail}"
    assert control.fault == ORACLES[name].fault.value


def test_batch_vs_solo_compares_at_least_32_tokens_per_request_with_joins(compose_cfg):
    r = _run(compose_cfg, ["model=llama_tiny", *SMALL], "batch_vs_solo")
    assert r.passed, r.detail
    assert r.metric["min_tokens"] >= 32 and r.metric["requests"] == 6 and r.metric["refused"] == 1
    assert r.metric["mean_batch"] > 1 and set(r.metric["builds_per_bucket"]) == {1, 2, 4}


def test_batch_isolation_checks_padding_rows_and_every_kv_tensor(compose_cfg):
    r = _run(compose_cfg, ["model=qwen3_tiny", "kv=paged", *SMALL], "batch_isolation")
    assert r.passed, r.detail
    layers = assemble(compose_cfg(["model=qwen3_tiny"])).model.dims.n_layers
    assert r.metric["padding_steps"] >= 1 and r.metric["kv_tensors"] == 2 * layers  # every layer's K and V pool
    assert r.metric["rows_compared"] > 20


def test_batch_plan_accounting_sees_row_changes_inside_a_bucket(compose_cfg):
    r = _run(compose_cfg, ["model=llama_tiny", *SMALL], "batch_plan_accounting")
    assert r.passed, r.detail
    assert r.metric["builds"] == len(r.metric["buckets_used"]) == 3
    assert r.metric["row_changes_inside_bucket"] >= 1 and r.metric["replan_builds"] == r.metric["replan_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ORACLE_NAMES)
def test_batch_oracles_on_inductor(compose_cfg, name):
    base = ["model=llama_tiny", "backend=inductor", *SMALL]
    healthy = _run(compose_cfg, base, name)
    assert healthy.passed, healthy.detail
