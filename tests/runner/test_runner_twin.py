"""The tiny twin: oracles whose question the weights cannot change run on the family's tiny size when the model
is a checkpoint; the others run on the checkpoint, and each result says which model answered."""
from __future__ import annotations

import pytest

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from fuelpipe.runner.table import render
from models.registry import build_random_model
from _support.weights_helpers import write_llama_gguf

MECHANISM = ("plan_vs_replan", "key_sensitivity", "rebind_guard", "batch_isolation", "plan_cache")
WEIGHTS = ("vs_reference", "config_variants", "kernel_parity", "vs_transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_llama_gguf(tmp_path_factory.mktemp("twin") / "tiny.gguf", build_random_model("llama", "tiny", seed=9))


def _assembly(compose_cfg, checkpoint, *extra):
    cfg = compose_cfg(["model=llama_tiny", "model.weights=gguf", f"model.path={checkpoint}",
                       "experiment.new_tokens=4", *extra])
    return cfg, assemble(cfg)


def test_every_builtin_oracle_declares_whether_it_needs_the_checkpoint():
    assert {n for n in ORACLES if not ORACLES.get(n).needs_checkpoint} >= set(MECHANISM)
    assert all(ORACLES.get(n).needs_checkpoint for n in WEIGHTS)


def test_mechanism_oracles_run_on_the_twin_and_weight_oracles_on_the_checkpoint(compose_cfg, checkpoint):
    cfg, asm = _assembly(compose_cfg, checkpoint)
    twin = asm.twin()
    assert twin is not None and twin.model is not asm.model
    assert twin.model.instance_id != asm.model.instance_id
    assert all(0 <= t < twin.model.dims.vocab_size for p in twin.prompts for t in p)
    on_twin = run_one(cfg, asm, ORACLES.get("key_sensitivity"))
    assert on_twin.passed, on_twin.detail
    assert on_twin.setup["model"] == "llama tiny twin (random weights, seed 0)"
    on_model = run_one(cfg, asm, ORACLES.get("vs_reference"))
    assert on_model.passed and "model" not in on_model.setup
    table = render({"config": cfg_json(cfg), "experiment": "parity", "env": {"device": "cpu", "threads": 1},
                    "reasons": [], "status": "ok", "oracles": [on_twin.to_json(), on_model.to_json()], "bench": None})
    line = next(x for x in table.splitlines() if x.startswith("key_sensitivity"))
    assert line.endswith("[on the llama tiny twin (random weights, seed 0)]")
    assert "twin" not in next(x for x in table.splitlines() if x.startswith("vs_reference"))


def test_a_negative_control_on_the_twin_is_still_caught(compose_cfg, checkpoint):
    cfg, asm = _assembly(compose_cfg, checkpoint, "experiment.oracles.rebind_guard.inject_fault=true")
    result = run_one(cfg, asm, ORACLES.get("rebind_guard"))
    assert result.negative_control and not result.passed and "twin" in result.setup["model"]


def test_mechanism_on_twin_false_runs_every_oracle_on_the_model(compose_cfg, checkpoint):
    cfg, asm = _assembly(compose_cfg, checkpoint, "experiment.mechanism_on_twin=false")
    assert asm.twin is None
    assert "model" not in run_one(cfg, asm, ORACLES.get("key_sensitivity")).setup


@pytest.mark.parametrize("model", ["llama_tiny", "deepseek_v2_tiny_dense"])
def test_a_random_model_is_its_own_twin(compose_cfg, model):
    """Every oracle runs on a random model, whatever its size: the dense DeepSeek is not the MoE tiny."""
    cfg = compose_cfg([f"model={model}", *(["kv=latent"] if model.startswith("deepseek") else [])])
    asm = assemble(cfg)
    assert asm.twin is None
    assert "model" not in run_one(cfg, asm, ORACLES.get("rebind_guard")).setup


def cfg_json(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
