"""Sweeps through the real CLI: a 2x2x2 joblib multirun plus its report, and skipped jobs."""
from __future__ import annotations

import json
import os

from conftest import run_cli
from _support.cli_runs import LEAN
from fuelpipe.results import schema_problems

# Two model sizes: the tiny Llama with one and with two layers. When a second tiny family's
# conf/model option lands, this axis can become model=llama_tiny,<family>_tiny.
SIZES = "+model.overrides.num_hidden_layers=1,2"


def test_2x2x2_joblib_sweep_and_report(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "hydra/launcher=joblib_local", SIZES, "backend=eager,fx", "plan=replan,plan_once", *LEAN,
        f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    docs = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert len(docs) == 8
    assert all(schema_problems(d) == [] and d["status"] == "ok" for d in docs)
    combos = {
        (d["config"]["model"]["overrides"]["num_hidden_layers"], d["config"]["backend"]["name"],
         d["config"]["plan"]["mode"]) for d in docs
    }
    assert len(combos) == 8
    assert "joblib is launching 8 jobs with loky (n_jobs=2," in proc.stdout  # the shipped launcher config ran them
    assert "sweep: 8 jobs, ok 8" in proc.stdout

    out = tmp_path / "report"
    proc = run_cli("report", str(sweep), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    table = (out / "report.md").read_text().splitlines()
    assert "\n".join(table) in proc.stdout
    assert len(table) == 2 + 8
    assert "model=llama_tiny[num_hidden_layers=1] backend=eager plan=replan" in table[2]
    csv_rows = (out / "report.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 8 and csv_rows[0].startswith("combination,status,decode_ms_per_token")
    png = (out / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_invalid_combination_in_a_sweep_is_skipped_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "kv=contiguous,latent", "backend=eager", *LEAN, "experiment.bench.enabled=false",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    docs = {json.loads(p.read_text())["config"]["kv"]["layout"]: json.loads(p.read_text())
            for p in sweep.rglob("results.json")}
    assert docs["contiguous"]["status"] == "ok"
    skipped = docs["latent"]
    assert skipped["status"] == "skipped" and skipped["passed"] is False and skipped["oracles"] == []
    assert "kv=latent needs an MLA model family; model.family=llama is not MLA" in skipped["reasons"]
    assert "sweep: 2 jobs, ok 1, skipped 1" in proc.stdout


def test_a_sweep_with_a_failing_job_exits_1_and_an_all_skipped_sweep_exits_2(tmp_path):
    proc = run_cli(
        "-m", "experiment.oracles.plan_vs_replan.inject_fault=false,true", "backend=eager", *LEAN,
        "experiment.bench.enabled=false", f"hydra.sweep.dir={tmp_path / 'a'}", cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "sweep: 2 jobs, failed 1, ok 1" in proc.stdout
    proc = run_cli("-m", "kv=latent,latent", "backend=eager", f"hydra.sweep.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "every job of the sweep was skipped" in proc.stderr
    assert os.path.isdir(tmp_path / "b")
