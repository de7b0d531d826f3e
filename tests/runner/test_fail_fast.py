"""``experiment.fail_fast``: the oracles after the first failure are recorded as skipped, not run."""
from __future__ import annotations

from fuelpipe.results import CONFIG_ERROR, FAILED, OK, schema_problems
from fuelpipe.runner.job import run_job
from fuelpipe.runner.table import render

THREE = ["experiment=smoke", "oracles=none", "experiment.bench.enabled=false",
         *(f"experiment.oracles.{n}.enabled=true" for n in ("plan_vs_replan", "vs_reference", "rebind_guard"))]
FAULT_IN_FIRST = "experiment.oracles.plan_vs_replan.inject_fault=true"


def test_after_the_first_failure_the_rest_are_skipped_naming_it(compose_cfg):
    doc = run_job(compose_cfg([*THREE, FAULT_IN_FIRST, "experiment.fail_fast=true"]))
    assert doc["status"] == FAILED and schema_problems(doc) == []
    first, *rest = doc["oracles"]
    assert first["name"] == "plan_vs_replan" and not first["passed"] and not first["skipped"]
    assert [o["name"] for o in rest] == ["vs_reference", "rebind_guard"]
    for o in rest:
        assert o["skipped"] and not o["passed"] and o["builds"] == 0
        assert o["detail"] == "skipped: not run: experiment.fail_fast stopped the gate at plan_vs_replan's failure"
    assert "stopped the gate at plan_vs_replan's failure" in render(doc)


def test_without_it_every_oracle_runs_after_a_failure(compose_cfg):
    """The control of the test above: the same failure, and the other two run (and pass)."""
    doc = run_job(compose_cfg([*THREE, FAULT_IN_FIRST]))
    assert doc["status"] == FAILED
    assert [(o["name"], o["passed"], o["skipped"]) for o in doc["oracles"]] == [
        ("plan_vs_replan", False, False), ("vs_reference", True, False), ("rebind_guard", True, False)]


def test_a_healthy_run_runs_every_oracle(compose_cfg):
    doc = run_job(compose_cfg([*THREE, "experiment.fail_fast=true"]))
    assert doc["status"] == OK and all(o["passed"] for o in doc["oracles"]) and len(doc["oracles"]) == 3


def test_with_the_negative_control_it_is_a_config_error_naming_both(compose_cfg):
    doc = run_job(compose_cfg([*THREE, "experiment.fail_fast=true", "experiment.negative_control=true"]))
    assert doc["status"] == CONFIG_ERROR and doc["oracles"] == []
    assert any("experiment.fail_fast=true" in r and "experiment.negative_control=true" in r for r in doc["reasons"])
