"""experiment=bench_batch: rows counted only when equal to B = 1, the scaling floor, the continuous run, the CLI."""
import json

import pytest

from conftest import run_cli
from fuelpipe.bench.batch_run import _ratios, _row, scaling_floor, verdict
from fuelpipe.bench.batch_systems import BatchRun, BatchSystem
from fuelpipe.runner.job import run_job

TINY = ["experiment=bench_batch", "experiment.bench_batch.batch_sizes=[1,2,4]", "experiment.bench_batch.new_tokens=5",
        "experiment.bench_batch.continuous.requests=5", "experiment.bench_batch.continuous.arrival_rate=200",
        "experiment.bench_batch.continuous.new_tokens=[3,6]"]


class Fake(BatchSystem):
    def __init__(self, name, group):
        self.name, self.group = name, group


def test_a_row_counts_only_when_its_tokens_equal_the_systems_own_b1_tokens():
    refs = [[1, 2, 3], [4, 5, 6]]
    runs = [BatchRun([[1, 2, 3], [4, 5, 9]], wall_s=0.5, decode_s=0.1, decode_steps=1)]
    row = _row(Fake("s", "fuelpipe"), 2, runs, refs, 3, {"tokens_per_s": 100.0, "bound": "bandwidth"})
    assert row["rows_equal"] == 1 and row["status"] == "rows differ from B=1"
    assert row["tokens_per_s"] == pytest.approx(3 / 0.5)  # the differing row's tokens do not count
    assert row["ms_per_token_per_request"] == pytest.approx(1000 * 0.5 / 3)
    assert row["decode_tokens_per_s"] == pytest.approx(1 / (0.1 / 2))


def test_ratios_and_verdict_compare_with_the_best_transformers_mode_at_the_same_batch():
    rows = [{"system": "fp", "group": "fuelpipe", "batch": 8, "tokens_per_s": 250.0},
            {"system": "hf a", "group": "transformers", "batch": 8, "tokens_per_s": 100.0},
            {"system": "hf b", "group": "transformers", "batch": 8, "tokens_per_s": 130.0},
            {"system": "lc", "group": "llama.cpp", "batch": 8, "tokens_per_s": 260.0}]
    _ratios(rows)
    assert rows[0]["over_best_transformers"] == pytest.approx(250 / 130) and rows[0]["best_transformers"] == "hf b"
    v = verdict(rows, 8)
    assert v["transformers"] == "hf b" and not v["over_transformers_met"] and v["target_over_transformers"] == 2.5
    assert v["over_llama_cpp"] == pytest.approx(250 / 260) and not v["over_llama_cpp_met"]
    rows[0]["tokens_per_s"] = 330.0  # 2.54x the best transformers mode, 1.27x llama.cpp: both targets met
    v = verdict(rows, 8)
    assert v["over_transformers_met"] and v["over_llama_cpp_met"] and v["target_over_llama_cpp"] == 1.2
    rows[0]["tokens_per_s"] = 311.0  # 2.39x and 1.196x: just short of each
    v = verdict(rows, 8)
    assert not v["over_transformers_met"] and not v["over_llama_cpp_met"]
    assert verdict(rows, 16) == {"batch": 16, "measured": False}


def test_the_floor_is_bandwidth_bound_at_small_batches_and_compute_bound_beyond(tiny_llama):
    prompts = [[1, 2, 3, 4]] * 64
    floor = scaling_floor(tiny_llama, prompts, 4, gb_s=10.0, gflops=50.0, sizes=[1, 2, 4, 8, 16, 32, 64])
    bounds = [floor[b]["bound"] for b in sorted(floor)]
    assert bounds[0] == "bandwidth" and bounds[-1] == "compute"
    assert bounds == sorted(bounds, key=lambda x: x == "compute")  # one switch, never back
    rates = [floor[b]["tokens_per_s"] for b in sorted(floor)]
    assert rates == sorted(rates)  # more rows never lower the floor's tokens/s
    one = floor[1]
    assert one["memory_ms"] == pytest.approx(1000 * (one["weight_bytes"] + one["kv_bytes_per_row"]) / 10e9)


def test_the_stage_runs_through_the_job_and_writes_its_section(compose_cfg):
    cfg = compose_cfg(TINY + ["experiment.bench_batch.transformers=[padded]", "experiment.bench_batch.llama_cpp=true"])
    doc = run_job(cfg)
    assert doc["status"] == "ok", doc.get("reasons")
    bb = doc["bench_batch"]
    ours = [r for r in bb["rows"] if r["group"] == "fuelpipe"]
    assert {(r["system"], r["batch"]) for r in ours} == {
        (f"fuelpipe fx {kv}", b) for kv in ("contiguous", "paged") for b in (1, 2, 4)}
    assert all(r["rows_equal"] == r["batch"] and r["tokens_per_s"] > 0 and r["floor_tokens_per_s"] > 0 for r in ours)
    peers = {r["system"]: r for r in bb["rows"] if r["group"] != "fuelpipe"}
    assert peers["transformers padded"]["status"] == "missing"  # random weights: no GGUF for the peers, said so
    assert "GGUF" in peers["transformers padded"]["why"]
    assert peers["llama.cpp F32"]["status"] == "missing"
    for run in bb["continuous"]:
        assert run["finished"] == run["requests"] == 5 and run["tokens"] == 3 + 6 + 3 + 6 + 3  # [3, 6] cycled
        assert run["latency_ms_p50"] <= run["latency_ms_p99"]
    assert bb["floor"]["gemm_gflops"] > 0 and bb["floor"]["bandwidth_gb_s"] > 0


def test_cli_writes_table_csv_and_plot(tmp_path):
    out = tmp_path / "run"
    run = run_cli(*TINY, "experiment.bench_batch.transformers=[]", "experiment.bench_batch.llama_cpp=false",
                  "experiment.bench_batch.kv_layouts=[contiguous]", f"hydra.run.dir={out}", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("bench_batch.md", "bench_batch.csv", "bench_batch.png"):
        assert (out / name).stat().st_size > 0
    assert "| fuelpipe fx contiguous | 4 | 4/4 |" in (out / "bench_batch.md").read_text()
    doc = json.loads((out / "results.json").read_text())
    assert doc["bench_batch"]["written"] and "### bench_batch" in run.stdout


@pytest.mark.parametrize("override, reason", [
    ("experiment.bench_batch.batch_sizes=[0,2]", "batch_sizes must be distinct integers >= 1, got [0, 2]"),
    ("experiment.bench_batch.batch_sizes=[1,32]", "the largest batch size 32 needs one per row"),
    ("experiment.bench_batch.transformers=[paded]", "did you mean 'padded'?"),
    ("experiment.bench_batch.backends=[inductr]", "did you mean 'inductor'?"),
    ("experiment.bench_batch.new_tokens=2", "new_tokens must be >= 3"),
    ("experiment.bench_batch.continuous.arrival_rate=0", "arrival_rate > 0"),
])
def test_bad_settings_are_refused_before_anything_runs(compose_cfg, override, reason):
    from fuelpipe.config.validate import validate

    reasons = validate(compose_cfg(["experiment=bench_batch", override]))
    assert any(reason in r for r in reasons), reasons


def test_cli_exits_2_on_a_bad_setting(tmp_path):
    run = run_cli("experiment=bench_batch", "experiment.bench_batch.batch_sizes=[0]", f"hydra.run.dir={tmp_path}/r",
                  cwd=tmp_path)
    assert run.returncode == 2 and "batch_sizes must be distinct" in run.stdout + run.stderr


@pytest.mark.slow
def test_real_smollm2_against_transformers_rows_equal_b1(tmp_path):
    """The real checkpoint: fuelpipe and transformers' padded and continuous modes, every row equal to B = 1."""
    out = tmp_path / "run"
    run = run_cli("model=smollm2_135m", "backend.threads=2", "experiment=bench_batch",
                  "experiment.bench_batch.batch_sizes=[1,2]", "experiment.bench_batch.new_tokens=8",
                  "experiment.bench_batch.transformers=[padded,continuous]", "experiment.bench_batch.llama_cpp=false",
                  "experiment.bench_batch.continuous.requests=4", "experiment.bench_batch.continuous.new_tokens=[4,8]",
                  f"hydra.run.dir={out}", cwd=tmp_path, timeout=900, default_model=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["bench_batch"]["rows"]
    for r in rows:
        if r["group"] == "fuelpipe" or r["system"] == "transformers padded":
            assert r["status"] == "ok" and r["rows_equal"] == r["batch"], r
        assert r.get("tokens_per_s") or r["status"] == "missing", r


def test_a_record_from_before_the_targets_were_fields_still_renders():
    from pathlib import Path

    from fuelpipe.bench.batch_report import markdown

    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "experiments" / "bench_batch_amd" / "results.json").read_text())["bench_batch"]
    assert "target_2x_transformers_met" in doc["verdict"]  # the old field names
    text = markdown(doc)
    assert "(target 2x: " in text and "llama.cpp (level: " in text
    doc["verdict"] = verdict([{"system": "fp", "group": "fuelpipe", "batch": 8, "tokens_per_s": 300.0},
                              {"system": "lc", "group": "llama.cpp", "batch": 8, "tokens_per_s": 200.0}], 8)
    assert "1.50x llama.cpp (target 1.2x: met)" in markdown(doc)
