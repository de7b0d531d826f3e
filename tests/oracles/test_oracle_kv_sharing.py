"""kv_sharing on every KV strategy: shared, scrambled, poisoned and recycled storage equals solo runs."""
import pytest

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one


@pytest.mark.parametrize("model,kv", [("qwen3_tiny", "paged"), ("phi_tiny", "contiguous"),
                                      ("deepseek_v2_tiny", "latent")])
def test_kv_sharing_passes_and_its_control_fails(compose_cfg, model, kv):
    base = [f"model={model}", f"kv={kv}", "experiment.new_tokens=6"]
    healthy = run_one(compose_cfg(base), assemble(compose_cfg(base)), ORACLES["kv_sharing"])
    assert healthy.passed, healthy.detail
    assert healthy.metric["requests"] == 3 and healthy.metric["prompt_lengths"][2] > 8  # the long prompt
    cfg = compose_cfg([*base, "experiment.oracles.kv_sharing.inject_fault=true"])
    control = run_one(cfg, assemble(cfg), ORACLES["kv_sharing"])
    assert not control.passed and control.metric["requests_diverged"] == 3, control.detail


def test_paged_requests_really_share_one_scrambled_pool(compose_cfg):
    cfg = compose_cfg(["model=llama_tiny", "kv=paged", "experiment.new_tokens=6"])
    result = run_one(cfg, assemble(cfg), ORACLES["kv_sharing"])
    assert result.passed and "one pool of" in result.detail and "blocks x 4" in result.detail
