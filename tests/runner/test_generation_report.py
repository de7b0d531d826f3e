"""What the main job reports about a generation: steady-state decode speed with the builds apart, and the
resident memory of each phase (load, prefill, first decode, decode, checks)."""
from __future__ import annotations

import pytest

from fuelpipe.results import schema_problems
from fuelpipe.runner.job import run_job
from fuelpipe.runner.table import render
from models.registry import build_random_model
from _support.weights_helpers import write_llama_gguf

GGUF = ["model=llama_tiny", "model.weights=gguf"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny Llama GGUF with a byte-level tokenizer (so jobs on it generate text)."""
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))



def test_generation_reports_steady_decode_the_builds_and_memory_per_phase(compose_cfg, tiny_gguf):
    """The printed speed is steady-state decode; the plan build, the first step and each phase's peak RSS are apart."""
    doc = run_job(compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=8",
                               "experiment.generate.stream=false"]))
    assert doc["status"] == "ok" and schema_problems(doc) == []
    gen = doc["generation"]
    assert gen["steady_steps"] == gen["new_tokens"] - 2  # every decode step after the first
    assert gen["plan_builds"] == 1 and gen["first_decode_ms"] >= 1000.0 * gen["plan_build_s"]
    assert gen["ms_per_token"] < gen["first_decode_ms"]  # the build sits in the first step, not in the median
    assert gen["prefill_ms"] >= gen["prefill_build_ms"] > 0  # the prompt program was built inside the prefill
    mem = doc["memory"]
    assert list(mem["phases"]) == ["load", "prefill", "first_decode", "decode", "checks"]
    for phase in mem["phases"].values():
        assert phase["peak_mb"] >= min(phase["start_mb"], phase["end_mb"]) > 0
    assert mem["weights_mb"] > 0 and mem["kv_mb"] == gen["kv_bytes"] / 2**20 > 0
    assert mem["generate_peak_mb"] >= mem["baseline_mb"]
    text = render(doc)
    assert "median of 6 steady steps" in text and "memory: peak RSS MB per phase load" in text


def test_decode_speed_keeps_the_first_step_out_of_the_median():
    from fuelpipe.runner.generate import decode_speed

    s = decode_speed([0.9, 0.010, 0.012, 0.011, 0.030])
    assert s["ms_per_token"] == pytest.approx(11.5) and s["steady_steps"] == 4
    assert s["first_decode_ms"] == pytest.approx(900.0)
    assert s["mean_ms_per_token_all_steps"] == pytest.approx(192.6)
    assert decode_speed([])["ms_per_token"] is None


@pytest.mark.parametrize("threads", [None, 1])
def test_generation_says_how_its_threads_were_chosen(compose_cfg, tiny_gguf, threads):
    """Left to fuelpipe, the count adapts to the load and the report counts the steps at each count;
    a count the user set stays fixed and is said so."""
    import torch

    caller = torch.get_num_threads()
    try:
        doc = run_job(compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=8",
                                   "experiment.generate.stream=false"]
                                  + ([] if threads is None else [f"backend.threads={threads}"])))
    finally:
        torch.set_num_threads(caller)
    use = doc["generation"]["threads"]
    if threads is None:
        assert use["adaptive"] is True and sum(use["steps_at"].values()) == doc["generation"]["new_tokens"] - 1
        assert "threads adapted to the load (decode steps" in render(doc)
    else:
        assert use == {"adaptive": False, "fixed": 1} and "threads fixed at 1" in render(doc)
