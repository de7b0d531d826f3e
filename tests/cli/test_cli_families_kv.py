"""Every tiny family, on every KV strategy that can serve it, through the runner and the CLI."""
from __future__ import annotations

import json

import pytest

from conftest import CONF, run_cli, default_or_slow
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.results import schema_problems
from fuelpipe.runner.job import run_job
from models.registry import families

TINY = sorted(p.stem for p in (CONF / "model").glob("*_tiny*.yaml"))


def kv_layouts(model_option: str) -> list[str]:
    family = model_option.split("_tiny")[0]
    return ["latent"] if families()[family].is_mla else ["contiguous", "paged"]


CASES = [(m, kv) for m in TINY for kv in kv_layouts(m)]


def test_every_family_has_a_tiny_config():
    assert {m.split("_tiny")[0] for m in TINY} == set(families())


@pytest.mark.parametrize("model, kv", default_or_slow(
    CASES, [("llama_tiny", "contiguous")], [f"{m}-{kv}" for m, kv in CASES]))
def test_parity_experiment_passes(compose_cfg, model, kv):
    overrides = [f"model={model}", f"kv={kv}", "experiment=parity", "backend=fx"]
    if kv == "paged":
        overrides.append("kv.block_size=4")  # the parity runs cross several block boundaries
    doc = run_job(compose_cfg(overrides))
    assert schema_problems(doc) == []
    assert doc["status"] == "ok", [o["detail"] for o in doc["oracles"] if not o["passed"]]
    assert len(doc["oracles"]) == len(ORACLES) and all(o["setup"]["kv"] == kv for o in doc["oracles"])


def test_multirun_over_all_families_and_kv_strategies(tmp_path):
    """Invalid pairs (latent for non-MLA, contiguous/paged for MLA) are skipped with reasons; the rest pass."""
    sweep = tmp_path / "sweep"
    lean = ["experiment=smoke", "backend=fx", "backend.threads=1", "experiment.bench.tokens=2",
            *(f"experiment.oracles.{n}.enabled=false" for n in ORACLES if n != "plan_vs_replan")]
    proc = run_cli("-m", "hydra/launcher=joblib_local", "model=" + ",".join(TINY), "kv=contiguous,paged,latent",
                   *lean, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    docs = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert len(docs) == 3 * len(TINY)
    by = {(d["config"]["model"]["family"] + "_" + d["config"]["model"]["size"], d["config"]["kv"]["layout"]): d
          for d in docs}
    for (model, kv), doc in by.items():
        if kv in kv_layouts(model):
            assert doc["status"] == "ok", (model, kv, doc.get("reasons"))
        else:
            assert doc["status"] == "skipped" and doc["reasons"], (model, kv)
