"""The real CLI in a subprocess: exit 0 / 1 / 2, the printed table, and results.json."""
from __future__ import annotations

import json
import re

from conftest import run_cli
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.results import schema_problems


def test_default_experiment_on_default_model_exits_0_and_prints_the_ratio(tmp_path):
    """The README's main command: the real SmolLM2 checkpoint, generated text, every oracle, the benchmark."""
    proc = run_cli(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, default_model=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for name in ORACLES:  # every registered oracle is on by default, and passes (transformers is a test extra)
        assert re.search(rf"^{name}\s+PASS\s", out, re.M), out
    plan_once = float(re.search(r"plan_once ms/token\s+([\d.]+)", out).group(1))
    replan = float(re.search(r"replan ms/token\s+([\d.]+)", out).group(1))
    ratio = float(re.search(r"replan/plan_once\s+([\d.]+)x", out).group(1))
    assert plan_once > 0 and replan > 0 and abs(ratio - replan / plan_once) < 0.01 * ratio + 0.01

    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert schema_problems(doc) == []
    assert doc["status"] == "ok" and doc["passed"] is True
    cfg = doc["config"]
    assert (cfg["model"]["family"], cfg["model"]["size"], cfg["experiment"]["name"]) == ("llama", "smollm2_135m", "default")
    assert cfg["model"]["weights"] == "shipped"
    assert doc["choices"] == {
        "model": "smollm2_135m", "kv": "contiguous", "backend": "fx", "plan": "plan_once", "experiment": "default"
    }
    gen = doc["generation"]
    assert gen["new_tokens"] > 0 and gen["text"].strip() and gen["text"] in out  # real text, streamed
    assert gen["tokens_per_s"] > 0 and doc["load"]["load_s"] > 0
    assert doc["bench"]["replan_over_plan_once"] == ratio or abs(doc["bench"]["replan_over_plan_once"] - ratio) < 0.01
    assert doc["bench"]["cache_policy"] == cfg["plan"]["cache_policy"] == "warm"
    assert doc["env"]["torch"] and doc["env"]["threads"] >= 1 and doc["env"]["device"] == "cpu"


def test_negative_control_exits_1(tmp_path):
    proc = run_cli("experiment=negative_control", "backend=eager", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.count(" FAIL ") == len(ORACLES)  # every oracle catches its fault
    doc = json.loads((tmp_path / "results.json").read_text())
    assert schema_problems(doc) == [] and doc["status"] == "failed" and doc["negative_control"] is True


def test_invalid_combination_exits_2_naming_the_reasons(tmp_path):
    proc = run_cli("kv=latent", "plan=captured", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "kv=latent needs an MLA model family; model.family=llama is not MLA" in proc.stdout
    assert "plan=captured needs CUDA" in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert schema_problems(doc) == []
    assert doc["status"] == "config_error" and len(doc["reasons"]) == 2 and doc["oracles"] == []


def test_misspelled_group_option_exits_2_before_running(tmp_path):
    proc = run_cli("model=llama_tni", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert ("unknown option for config group 'model' 'llama_tni'; did you mean 'llama_tiny'? "
            "available: ") in proc.stderr and "llama_tiny, phi_tiny, qwen3_tiny, smollm2_135m" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing ran


def test_misspelled_key_exits_2(tmp_path):
    # (every value of a sweep axis is checked the same way: tests/test_config_preflight.py)
    proc = run_cli("experiment.bench.tokenz=3", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown key in experiment.bench 'tokenz'; did you mean 'tokens'?" in proc.stderr
    assert not (tmp_path / "run").exists()
