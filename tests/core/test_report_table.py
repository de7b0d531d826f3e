"""fuelpipe report: every results.json under a directory -> one Markdown/CSV table and one PNG."""
from __future__ import annotations

import csv
import json

import pytest

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from conftest import CONF, FAST
from fuelpipe.config.preflight import VERSION_BASE
from fuelpipe.report import collect_rows, main as report_main, markdown
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.results import write_results
from fuelpipe.runner.job import run_job

LEAN = [*FAST, "experiment=smoke", "experiment.bench.tokens=2",
        *(f"experiment.oracles.{n}.enabled=false" for n in ORACLES if n not in ("plan_vs_replan", "plan_accounting"))]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A directory shaped like a sweep: ok, failed and skipped jobs, plus one malformed file."""
    tmp_path = tmp_path_factory.mktemp("sweep")
    jobs = {
        "0": [],
        "1": ["experiment.oracles.plan_accounting.inject_fault=true"],
        "2": ["kv=latent"],
        "10": ["plan=replan"],
    }
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base=VERSION_BASE):
        for sub, extra in jobs.items():
            write_results(tmp_path / sub, run_job(compose("config", overrides=[*LEAN, *extra]), sweep=True))
    GlobalHydra.instance().clear()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.json").write_text(json.dumps({"status": "ok"}))
    return tmp_path


def test_rows_hold_status_timing_and_reasons(sweep_dir, capsys):
    rows = collect_rows(sweep_dir)
    assert "skipping" in capsys.readouterr().err  # the malformed file is reported, not tabulated
    assert [r["path"] for r in rows] == ["0", "1", "2", "10"]  # job 2 before job 10
    assert [r["status"] for r in rows] == ["ok", "failed", "skipped", "ok"]
    # labels name only what varies across the sweep
    assert [r["combination"] for r in rows] == [
        "kv=contiguous plan=plan_once", "kv=contiguous plan=plan_once", "kv=latent plan=plan_once",
        "kv=contiguous plan=replan",
    ]
    assert rows[0]["decode_ms_per_token"] > 0 and rows[0]["replan_over_plan_once"] > 0
    assert rows[1]["notes"] == "failed: plan_accounting" and rows[1]["oracles_passed"] == "1/2"
    assert "kv=latent needs an MLA model family" in rows[2]["notes"] and rows[2]["decode_ms_per_token"] is None
    table = markdown(rows).splitlines()
    assert table[0].startswith("| combination | status | decode_ms_per_token |") and len(table) == 6


def test_report_command_writes_table_csv_and_png(sweep_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert report_main([str(sweep_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "report.md").read_text().strip() in printed
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "failed", "skipped", "ok"]
    assert float(rows[0]["decode_ms_per_token"]) > 0 and rows[2]["decode_ms_per_token"] == ""
    png = (out / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_report_on_a_directory_without_results_exits_2(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 2
    assert "no well-formed results.json under" in capsys.readouterr().err
