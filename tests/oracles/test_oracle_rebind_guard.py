"""rebind_guard: half-way refusals leave nothing moved, other capacities and dtypes are never silently reused."""
from __future__ import annotations

import pytest
import torch

from conftest import PROMPT, default_or_slow
from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan import session as session_module
from fuelpipe.plan.validity import StorageFingerprint
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from models.registry import build_random_model, families

NAME = "rebind_guard"
CASES = [(f, kv) for f, e in sorted(families().items()) for kv in (("latent",) if e.is_mla else ("contiguous", "paged"))]


def _run(compose_cfg, family, kv, *extra):
    overrides = [f"model={family}_tiny", f"kv={kv}", "experiment.new_tokens=4", *extra]
    cfg = compose_cfg(overrides)
    return run_one(cfg, assemble(cfg), ORACLES[NAME])


def _failed(result) -> str:
    return result.detail.split("failed: ", 1)[1]


@pytest.mark.parametrize("family, kv", default_or_slow(
    CASES, [("llama", "paged"), ("phi", "contiguous"), ("deepseek_v2", "latent")], [f"{f}-{kv}" for f, kv in CASES]))
def test_passes_on_fx_and_catches_a_partial_rebind(compose_cfg, family, kv):
    healthy = _run(compose_cfg, family, kv, "backend=fx")
    assert healthy.passed, healthy.detail
    assert healthy.metric["max_abs_error"] == 0.0
    assert healthy.metric["checks"] == (17 if kv == "paged" else 13)

    control = _run(compose_cfg, family, kv, "backend=fx", f"experiment.oracles.{NAME}.inject_fault=true")
    assert not control.passed and control.fault == "partial_rebind"
    failed = _failed(control)
    # The half-rebound plan is seen twice: slots moved, and the original cache no longer served right.
    assert "left the bound KV and the key untouched" in failed and "still serves its original cache" in failed
    assert control.metric["failed_checks"] == 2, failed


@pytest.mark.parametrize("kv, plan", [("contiguous", "plan_once"), ("paged", "replan")])
def test_passes_on_eager_and_under_replan(compose_cfg, kv, plan):
    result = _run(compose_cfg, "llama", kv, "backend=eager", f"plan={plan}")
    assert result.passed, result.detail
    assert "plan_once" in result.detail  # rebinds exist only there: a replan run checks the plan_once guard


def test_a_guard_that_compares_shapes_only_is_caught(compose_cfg, monkeypatch):
    """A planted bug: storage is judged by dtype and shape alone, so a carved buffer of another extent is
    rebound and the plan would outlive a storage it never checked."""
    def lenient(baked, incoming):
        return baked.dtype == incoming.dtype and baked.shape == incoming.shape

    monkeypatch.setattr(session_module, "interchangeable", lenient)
    result = _run(compose_cfg, "llama", "contiguous", "backend=fx")
    failed = _failed(result)
    assert "rebind refused half-way" in failed and "differs (refused, rebuilt)" in failed, failed


def test_a_guard_that_forgets_the_dtype_is_caught_by_the_direct_rebind(compose_cfg, monkeypatch):
    def shape_and_extent(baked, incoming):
        a, b = StorageFingerprint.of(baked), StorageFingerprint.of(incoming)
        return (a.shape, a.stride, a.storage_offset) == (b.shape, b.stride, b.storage_offset)

    monkeypatch.setattr(session_module, "interchangeable", shape_and_extent)
    result = _run(compose_cfg, "llama", "paged", "backend=fx")
    assert "a direct rebind onto the torch.bfloat16 cache refused" in _failed(result)


@pytest.mark.parametrize("kind", ["contiguous", "paged", "latent"])
def test_a_cache_of_another_dtype_is_a_config_error_before_anything_runs(kind):
    model = build_random_model("deepseek_v2" if kind == "latent" else "llama", "tiny", seed=4)
    ctx = InferenceContext(model, "fx")
    own = ctx.new_pool(6, 4).sequence(4) if kind == "paged" else ctx.new_cache(16)
    ctx.prefill(own, PROMPT)
    ctx.decode(own, 1)  # a held plan
    held, builds = ctx.plan.session, ctx.plan.stats.builds
    if kind == "paged":
        pool = ctx.new_pool(6, 4, torch.bfloat16)
        other = pool.sequence(4)
    else:
        other = ctx.new_cache(16, torch.bfloat16)
    for call in (lambda: ctx.prefill(other, PROMPT), lambda: ctx.decode(other, 1)):
        with pytest.raises(ConfigError, match=r"cache dtype torch.bfloat16 must equal the model's torch.float32"):
            call()
    assert other.cached_len == 0 and ctx.plan.session is held and ctx.plan.stats.builds == builds
    if kind == "paged":
        assert pool.free_blocks == 5 and other.blocks == []  # no block was taken


@pytest.mark.slow
def test_passes_on_inductor(compose_cfg):
    result = _run(compose_cfg, "llama", "paged", "backend=inductor")
    assert result.passed, result.detail
