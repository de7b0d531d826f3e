"""The context-scaling study: filled caches, plan reuse across lengths, and the CLI run."""
import json

import pytest
import torch

from conftest import run_cli
from fuelpipe.runner.job import run_job
from fuelpipe.bench.context_scaling import ARM_SPECS, filled_cache
from fuelpipe.context import InferenceContext


def test_every_arm_computes_the_same_step_on_the_same_filled_context(tiny_llama):
    """Tensor (masked capacity), symbol (live prefix), sized and paged read the same K/V: same logits."""
    logits = {}
    for name, arm in ARM_SPECS.items():
        ctx = InferenceContext(tiny_llama, "fx", offset_mode=arm.offset_mode)
        capacity = 24 if arm.sized else 40
        cache = filled_cache(ctx, arm, 20, capacity, 8, torch.Generator().manual_seed(3))
        assert cache.cached_len == 20
        logits[name] = ctx.decode(cache, 5)[0]
    first = logits["contiguous tensor"]
    for name, row in logits.items():
        torch.testing.assert_close(row, first, atol=1e-5, rtol=0, msg=name)


def test_negative_control_different_fill_changes_the_step(tiny_llama):
    """The comparison above can fail: a differently filled context gives other logits."""
    arm = ARM_SPECS["contiguous tensor"]
    ctx = InferenceContext(tiny_llama, "fx")
    a = ctx.decode(filled_cache(ctx, arm, 20, 40, 8, torch.Generator().manual_seed(3)), 5)
    b = ctx.decode(filled_cache(ctx, arm, 20, 40, 8, torch.Generator().manual_seed(4)), 5)
    assert (a - b).abs().max() > 1e-4


def test_cli_bench_context_reuses_plans_across_lengths_and_writes_plot(tmp_path):
    rec = tmp_path / "record"
    proc = run_cli(
        "experiment=bench_context", "experiment.context.lengths=[4,16]", "experiment.context.tokens=2",
        "experiment.context.warmup=1", f"experiment.context.record_dir={rec}", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["context_scaling"]["rows"]
    builds = {(r["arm"], r["context"]): r["plan_builds"] for r in rows}
    assert len(rows) == 10
    for arm in ("contiguous tensor", "contiguous symbol", "paged", "paged symbol"):  # fixed capacity: built once, then rebound
        assert (builds[arm, 4], builds[arm, 16]) == (1, 0), arm
    assert builds["contiguous sized", 16] == 1  # a new capacity is a new geometry: rebuilt
    attended = {(r["arm"], r["context"]): r["kv_bytes_attended_per_token"] for r in rows}
    assert attended["contiguous symbol", 16] > attended["contiguous symbol", 4]
    assert attended["contiguous tensor", 16] == attended["contiguous tensor", 4]
    assert attended["paged symbol", 16] > attended["paged symbol", 4]
    assert attended["paged", 16] == attended["paged", 4]
    for d in (tmp_path / "run", rec):
        assert (d / "context.png").stat().st_size > 0
        assert "| contiguous symbol |" in (d / "context.md").read_text()


def test_cli_bench_context_runs_the_sized_arm_alone(tmp_path):
    proc = run_cli(
        "experiment=bench_context", "experiment.context.lengths=[4]", "experiment.context.tokens=1",
        "experiment.context.warmup=1", "experiment.context.arms=[contiguous sized]",
        f"hydra.run.dir={tmp_path}", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| contiguous sized |" in (tmp_path / "context.md").read_text()


@pytest.mark.parametrize(
    "override, reason",
    [
        ("experiment.context.arms=[pagd]", "unknown experiment.context.arms entry 'pagd'; did you mean 'paged'?"),
        ("experiment.context.lengths=[100000]", "beyond the model's max_position_embeddings"),
        ("experiment.context.tokens=0", "experiment.context needs tokens >= 1"),
        ("experiment.context.arms=[]", "experiment.context.arms is empty"),
    ],
)
def test_bench_context_refuses_bad_settings(compose_cfg, override, reason):
    doc = run_job(compose_cfg(["experiment=bench_context", override]))
    assert doc["status"] == "config_error"
    assert any(reason in r for r in doc["reasons"]), doc["reasons"]


def test_cli_exits_2_on_a_bad_context_setting(tmp_path):
    proc = run_cli("experiment=bench_context", "experiment.context.lengths=[100000]", f"hydra.run.dir={tmp_path}",
                   cwd=tmp_path)
    assert proc.returncode == 2
    assert "beyond the model's max_position_embeddings" in proc.stdout
