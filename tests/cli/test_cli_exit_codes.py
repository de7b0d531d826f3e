"""The real CLI in a subprocess: exit 0 / 1 / 2, the printed table, and results.json."""
from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.results import schema_problems


@pytest.mark.slow  # ~3 min: .ci/run runs it in its own step (the README main command)
def test_default_experiment_on_default_model_exits_0_and_prints_the_ratio(tmp_path):
    """The README's main command: the real SmolLM2 checkpoint, generated text, every oracle, the benchmark."""
    proc = run_cli(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, default_model=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for name in ORACLES:  # every registered oracle is on by default, and passes (transformers is a test extra) ...
        # ... but quant_quality (f32 weights), which says SKIP
        verdict = "SKIP" if name == "quant_quality" else "PASS"
        assert re.search(rf"^{name}\s+{verdict}\s", out, re.M), out
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
        "model": "smollm2_135m", "kv": "contiguous", "backend": "aot", "plan": "plan_once", "oracles": "gate",
        "experiment": "default",
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
    # Every oracle catches its fault, except quant_quality, which needs quantized weights (a SKIP naming it;
    # its negative control runs in tests/quant/test_quant.py).
    assert proc.stdout.count(" FAIL ") == len(ORACLES) - 1
    assert "quant_quality         SKIP" in proc.stdout
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
    # (every value of a sweep axis is checked the same way: tests/config/test_config_preflight.py)
    proc = run_cli("experiment.bench.tokenz=3", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown key in experiment.bench 'tokenz'; did you mean 'tokens'?" in proc.stderr
    assert not (tmp_path / "run").exists()


def _no_traceback(proc):
    assert "Traceback" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_a_checkpoint_error_exits_2_with_the_typed_message_and_no_traceback(tmp_path):
    import numpy as np

    from models.registry import build_random_model
    from _support.weights_helpers import llama_gguf_tensors, write_llama_gguf

    tiny = build_random_model("llama", "tiny", seed=5)
    tensors = llama_gguf_tensors(tiny)
    tensors["blk.0.attn_v.weight"][1, 2] = np.inf
    path = write_llama_gguf(tmp_path / "inf.gguf", tiny, tensors=tensors)
    proc = run_cli("model.weights=gguf", f"model.path={path}", "experiment=smoke",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert "tensor 'blk.0.attn_v.weight' holds 1 non-finite value(s)" in proc.stdout
    _no_traceback(proc)
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["status"] == "config_error" and schema_problems(doc) == []


def test_a_generation_request_that_cannot_fit_exits_2_before_generating(tmp_path):
    from models.registry import build_random_model
    from _support.weights_helpers import write_llama_gguf

    path = write_llama_gguf(tmp_path / "tiny.gguf", build_random_model("llama", "tiny", seed=5))
    proc = run_cli("model.weights=gguf", f"model.path={path}", "experiment=generate", "max_new_tokens=600",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert "beyond the model's max_position_embeddings 512" in proc.stdout
    assert "---" not in proc.stdout  # nothing was streamed: refused before generating
    _no_traceback(proc)


def test_a_crash_of_fuelpipe_exits_3_with_its_traceback_not_1(tmp_path):
    """A bug (planted here) must not read as "an oracle failed"."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, fuelpipe.runner.job as job\n"
            "def planted(*a, **k):\n    raise RuntimeError('planted bug')\n"
            "job.run_oracles = planted\n"
            "from fuelpipe.cli import main\nmain(sys.argv[1:])\n")
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code, "model=llama_tiny", "experiment=smoke", "backend=eager",
                           f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" in proc.stdout + proc.stderr and "RuntimeError: planted bug" in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "error" and schema_problems(doc) == []


def _doc(status, tmp, name):
    from fuelpipe.results import results_doc, write_results

    env = {"fuelpipe": "0", "torch": "2", "python": "3", "platform": "x", "device": "cpu", "threads": 1,
           "git": None}
    config = {"experiment": {"name": "t"},
              "model": {"family": "llama", "size": name, "dtype": "float32", "overrides": {}},
              "kv": {"layout": "contiguous"}, "backend": {"name": "eager", "device": "cpu"},
              "plan": {"mode": "plan_once", "offset_mode": None}}
    reasons = [] if status in ("ok", "failed") else [f"{status} reason"]
    doc = results_doc(status, config=config, env=env, reasons=reasons, choices={"model": name})
    if status == "error":
        doc["error"] = {"type": "RuntimeError", "message": "x", "traceback": "Traceback ..."}
    write_results(tmp / name, doc)


@pytest.mark.parametrize("statuses, code", [
    (("ok", "skipped"), 0),
    (("ok", "failed", "error"), 1),  # a verdict outranks a crash
    (("ok", "error", "skipped"), 3),
    (("skipped", "skipped"), 2),
])
def test_sweep_exit_codes(tmp_path, capsys, statuses, code):
    from fuelpipe.cli import _sweep_exit

    for i, status in enumerate(statuses):
        _doc(status, tmp_path, f"job{i}")
    assert _sweep_exit(tmp_path) == code
