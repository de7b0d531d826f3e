"""Smoke-run every experiment preset on the tiny model, in-process, and check what it ran."""
from __future__ import annotations

import pytest

from conftest import CONF, FAST
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.results import schema_problems
from fuelpipe.runner.job import run_job

PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# The speed studies are sized for a real checkpoint; on the tiny model they run a few steps.
STUDY_SIZES = {
    "bench_peers": ["experiment.peers.prompt_tokens=8", "experiment.peers.new_tokens=3", "experiment.peers.reps=1",
                    "experiment.peers.backends=[eager]", "experiment.peers.kv_layouts=[contiguous]",
                    "experiment.peers.llama_cpp=false", "experiment.peers.transformers=[dynamic]",
                    "experiment.peers.quantized=[int8]", "experiment.peers.quantized_backends=[fx]"],
    "bench_context": ["experiment.context.lengths=[4,8]", "experiment.context.tokens=1"],
    "bench_batch": ["experiment.bench_batch.batch_sizes=[1,2]", "experiment.bench_batch.new_tokens=4",
                    "experiment.bench_batch.kv_layouts=[paged]", "experiment.bench_batch.transformers=[padded]",
                    "experiment.bench_batch.llama_cpp=false", "experiment.bench_batch.continuous.requests=3",
                    "experiment.bench_batch.continuous.new_tokens=[4]"],
}


def test_presets_found():
    assert {"default", "smoke", "parity", "bench", "negative_control", "generate"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_on_the_tiny_model(preset, compose_cfg):
    # generate needs a tokenizer: it runs on the real (shipped) SmolLM2 checkpoint, briefly
    model = ["model=smollm2_135m", "max_new_tokens=6"] if preset == "generate" else ["model=llama_tiny"]
    cfg = compose_cfg([f"experiment={preset}", *model, *FAST, *STUDY_SIZES.get(preset, [])])
    doc = run_job(cfg)
    assert schema_problems(doc) == []
    assert doc["experiment"] == preset
    exp = cfg.experiment
    ran = [o["name"] for o in doc["oracles"]]
    assert ran == [name for name, oc in exp.oracles.items() if oc.enabled]
    assert set(ran) <= set(ORACLES)
    assert (doc["bench"] is not None) == exp.bench.enabled
    if preset == "generate":
        assert doc["generation"]["new_tokens"] >= 1 and doc["generation"]["text"]
    if doc["bench"]:
        assert doc["bench"]["tokens"] == exp.bench.tokens
        assert doc["bench"]["decode_ms_per_token"] > 0
    assert ("peers" in doc) == exp.peers.enabled and ("context_scaling" in doc) == exp.context.enabled
    if exp.negative_control:
        # every oracle must catch its injected fault
        assert doc["status"] == "failed" and ran
        assert all(not o["passed"] and o["negative_control"] and o["fault"] != "none" for o in doc["oracles"])
    else:
        assert doc["status"] == "ok", [o["detail"] for o in doc["oracles"] if not o["passed"]]
        assert all(o["fault"] == "none" for o in doc["oracles"])
