"""A job's up-front phase: bad checkpoints and generation requests are configuration errors, found before
anything runs; a crash of fuelpipe itself is its own status; the record names the model actually loaded."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from fuelpipe.results import schema_problems
from fuelpipe.runner import job as job_module
from fuelpipe.runner.job import run_job
from fuelpipe.runner.table import render
from models.registry import build_random_model
from _support.weights_helpers import llama_gguf_tensors, write_llama_gguf

GGUF = ["model=llama_tiny", "model.weights=gguf"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny Llama GGUF with a byte-level tokenizer (so jobs on it generate text)."""
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


def _refused(doc, *phrases):
    assert doc["status"] == "config_error" and doc["oracles"] == [] and doc.get("generation") is None, doc["status"]
    assert schema_problems(doc) == []
    assert any(all(p in r for p in phrases) for r in doc["reasons"]), doc["reasons"]


def _nan_gguf(path):
    tiny = build_random_model("llama", "tiny", seed=5)
    tensors = llama_gguf_tensors(tiny)
    tensors["blk.1.ffn_up.weight"][3, 7] = np.nan
    return write_llama_gguf(path, tiny, tensors=tensors)


def _truncated_gguf(path):
    write_llama_gguf(path, build_random_model("llama", "tiny", seed=5))
    path.write_bytes(path.read_bytes()[:-1000])
    return path


def _pickle(path):
    path.write_bytes(pickle.dumps({"w": 1}, protocol=4))
    return path


def _dir_without_config(path):
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    return path


def _invalid_config_json(path):
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 256,
                                                  "hidden_size": 64.5, "intermediate_size": 128,
                                                  "num_hidden_layers": 2, "num_attention_heads": 4}))
    return path


@pytest.mark.parametrize("weights, make, name, phrases", [
    ("gguf", _nan_gguf, "nan.gguf", ["'blk.1.ffn_up.weight'", "1 non-finite value(s)", "index [3, 7]"]),
    ("gguf", _truncated_gguf, "cut.gguf", ["truncated"]),
    ("gguf", _pickle, "model.pt", ["pickle", "refused"]),
    ("hf_dir", _dir_without_config, "hf", ["needs a config.json"]),
    ("hf_dir", _invalid_config_json, "hf", ["config.json hidden_size=64.5 must be an integer"]),
])
def test_checkpoint_errors_are_configuration_errors_and_skips_in_a_sweep(compose_cfg, tmp_path, weights, make, name,
                                                                        phrases):
    path = make(tmp_path / name)
    cfg = compose_cfg(["model=llama_tiny", f"model.weights={weights}", f"model.path={path}", "experiment=smoke"])
    _refused(run_job(cfg), str(path), *phrases)
    swept = run_job(cfg, sweep=True)
    assert swept["status"] == "skipped" and any(phrases[0] in r for r in swept["reasons"])


@pytest.mark.parametrize("overrides, phrases", [
    (["max_new_tokens=600"], ["the generation writes 644 positions (45-token prompt + max_new_tokens=600 - 1)",
                              "beyond the model's max_position_embeddings 512"]),
    (["prompt=''"], ["the generation prompt is empty"]),
    (["prompt='   '"], ["the generation prompt is empty"]),
    (["experiment.generate.max_new_tokens=0"], ["experiment.generate.max_new_tokens must be >= 1, got 0"]),
    (["experiment.generate.temperature=-1"], ["temperature must be > 0"]),
    (["max_new_tokens=80", "kv.max_seq_len=100"], ["writes 124 positions", "more than kv.max_seq_len=100"]),
    (["max_new_tokens=80", "kv=paged", "kv.block_size=16", "kv.num_blocks=6"],
     ["kv.num_blocks=6 is too small", "writes 124 positions", "need 8 blocks of 16 plus the null block"]),
])
def test_generation_requests_that_cannot_run_are_refused_up_front(compose_cfg, tiny_gguf, monkeypatch, overrides,
                                                                  phrases):
    monkeypatch.setattr(job_module, "run_generation", _must_not_run)
    cfg = compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", *overrides])
    _refused(run_job(cfg), *phrases)


def _must_not_run(*args, **kwargs):
    raise AssertionError("generation ran although the request was refused up front")


def test_generation_honours_kv_max_seq_len(compose_cfg, tiny_gguf):
    doc = run_job(compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=3",
                               "kv.max_seq_len=100", "experiment.generate.stream=false"]))
    assert doc["status"] == "ok" and schema_problems(doc) == []
    assert doc["generation"]["kv_capacity"] == 100 and doc["generation"]["new_tokens"] == 3


def test_an_empty_text_prompt_is_a_configuration_error_not_a_failed_oracle(compose_cfg, tiny_gguf):
    doc = run_job(compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=smoke",
                               "experiment.text_prompts=[ok then,'']"]))
    _refused(doc, "experiment.text_prompts entries [1] are empty")


def test_a_crash_is_status_error_with_the_exception_recorded(compose_cfg, monkeypatch):
    def planted(*args, **kwargs):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(job_module, "run_oracles", planted)
    for sweep in (False, True):
        doc = run_job(compose_cfg(["experiment=smoke", "backend=eager"]), sweep=sweep)
        assert doc["status"] == "error" and doc["passed"] is False and schema_problems(doc) == []
        assert doc["reasons"] == ["internal error: RuntimeError: planted bug"]
        assert doc["error"]["type"] == "RuntimeError" and doc["error"]["message"] == "planted bug"
        assert "planted" in doc["error"]["traceback"] and "Traceback" in doc["error"]["traceback"]
    assert "error: fuelpipe itself failed (a bug, not your configuration): RuntimeError: planted bug" in render(doc)


def test_an_error_document_without_its_error_object_breaks_the_schema(compose_cfg, monkeypatch):
    monkeypatch.setattr(job_module, "run_oracles", lambda *a: 1 / 0)
    doc = run_job(compose_cfg(["experiment=smoke", "backend=eager"]))
    assert doc["error"]["type"] == "ZeroDivisionError"
    del doc["error"]
    assert any("needs an error object" in p for p in schema_problems(doc))


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    pytest.importorskip("transformers", reason="the Gemma 3 directory is written by transformers (test extra)")
    from _support.hf_helpers import build_pair

    _, hf = build_pair("gemma3", seed=3)
    path = tmp_path_factory.mktemp("gemma3") / "gemma3-tiny"
    hf.save_pretrained(path, safe_serialization=True)
    return path


def test_the_record_names_the_model_actually_loaded_and_a_family_mismatch(compose_cfg, gemma3_dir):
    """The default composed model is ``llama smollm2_135m``; pointing model.path at a Gemma 3 directory runs Gemma 3."""
    cfg = compose_cfg(["model.weights=hf_dir", f"model.path={gemma3_dir}", "experiment=smoke", "backend=eager",
                       "experiment.bench.enabled=false"], tiny=False)
    assert (cfg.model.family, cfg.model.size) == ("llama", "smollm2_135m")
    doc = run_job(cfg)
    assert doc["status"] == "ok" and schema_problems(doc) == [], [(o["name"], o["detail"][:600]) for o in doc["oracles"] if not o["passed"] and not o.get("skipped")]
    ran = doc["model"]
    assert (ran["family"], ran["architecture"], ran["source"], ran["path"]) == (
        "gemma3", "Gemma3ForCausalLM", "safetensors", str(gemma3_dir))
    assert ran["size"] is None and ran["dims"]["n_layers"] >= 1 and ran["dims"]["vocab_size"] == 256
    assert "model.family=llama (model.size=smollm2_135m) is not what was loaded" in ran["family_mismatch"]
    assert "is a gemma3 model (Gemma3ForCausalLM)" in ran["family_mismatch"]
    table = render(doc)
    assert table.splitlines()[0].startswith(f"fuelpipe smoke: gemma3 {gemma3_dir} ")
    assert "llama" not in table.splitlines()[0] and "smollm2_135m" not in table.splitlines()[0]
    assert f"model: gemma3 (Gemma3ForCausalLM from {gemma3_dir}): " in table
    assert f"warning: {ran['family_mismatch']}" in table


def test_a_matching_checkpoint_and_random_weights_have_no_mismatch(compose_cfg, tiny_gguf):
    doc = run_job(compose_cfg(["experiment=smoke", "backend=eager", "experiment.bench.enabled=false"]))
    ran = doc["model"]
    assert (ran["family"], ran["size"], ran["source"], ran["path"], ran["family_mismatch"]) == (
        "llama", "tiny", "random", None, None)
    assert ran["dims"] == {"n_layers": 2, "hidden_size": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                           "vocab_size": 256, "max_position_embeddings": 512}
    assert "warning:" not in render(doc)
    doc = run_job(compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=2",
                               "experiment.generate.stream=false"]))
    assert doc["model"]["family_mismatch"] is None and doc["model"]["architecture"] == "llama"


def test_several_prompts_are_served_by_continuous_batching(compose_cfg, tiny_gguf, capsys):
    from fuelpipe.runner.table import render

    cfg = compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=5",
                       "batch.max_batch=2", "experiment.generate.stream=false"])
    cfg.experiment.generate.prompts = ["a", "bcd efg", "hi there, how are you?"]
    doc = run_job(cfg)
    assert doc["status"] == "ok", doc.get("reasons")
    gen = doc["generation"]
    assert [r["prompt"] for r in gen["requests"]] == ["a", "bcd efg", "hi there, how are you?"]
    assert all(r["finish"] in ("length", "stop") and r["tokens"] for r in gen["requests"])
    assert gen["requests"][2]["joined_at_step"] > 0  # two rows: the third prompt waited for a free one
    assert gen["batch"]["max_batch"] == 2 and gen["batch"]["builds"] == len(gen["batch"]["builds_per_bucket"])
    assert "3 prompts" in render(doc)


def test_several_prompts_with_one_too_long_is_refused_up_front(compose_cfg, tiny_gguf):
    cfg = compose_cfg([*GGUF, f"model.path={tiny_gguf}", "experiment=generate", "max_new_tokens=500"])
    cfg.experiment.generate.prompts = ["a", "b" * 40]
    doc = run_job(cfg)
    assert doc["status"] == "config_error"
    assert any("experiment.generate.prompts[1]" in r and "max_position_embeddings" in r for r in doc["reasons"])

