"""results.json schema: the documented tables and the checker agree, and the checker can fail."""
from __future__ import annotations

import copy
import re

import pytest

from conftest import ROOT
from fuelpipe.results import BENCH_KEYS, ENV_KEYS, ORACLE_KEYS, TOP_LEVEL, results_doc, schema_problems

DOC = ROOT / "docs" / "results_schema.md"
SECTIONS = {"Top level": TOP_LEVEL, "oracles[]": ORACLE_KEYS, "bench": BENCH_KEYS, "env": ENV_KEYS}


def _documented(section: str) -> dict[str, bool]:
    """key -> required, from the table under '## <section>'."""
    text = DOC.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) == "yes" for m in re.finditer(r"^\| `([a-z_0-9]+)` \| [^|]+ \| (yes|no) \|", body, re.M)}


@pytest.mark.parametrize("section", SECTIONS)
def test_documented_required_keys_are_the_checked_keys(section):
    documented = _documented(section)
    assert documented, f"no table under '## {section}'"
    assert {k for k, required in documented.items() if required} == set(SECTIONS[section])


def _valid_doc():
    bench = {k: 1.0 for k in BENCH_KEYS}
    bench.update(plan_mode="plan_once", cache_policy="warm", plan_builds=1, tokens=4, warmup=1, kv_bytes=8)
    oracle = {"name": "plan_vs_replan", "passed": True, "metric": {}, "tolerance": 0.0, "detail": "",
              "negative_control": False, "fault": "none", "seconds": 0.1, "setup": {}, "skipped": False}
    env = {"fuelpipe": "0", "torch": "2", "python": "3", "platform": "x", "device": "cpu", "threads": 1, "git": None}
    return results_doc("ok", config={"experiment": {"name": "t"}}, env=env, oracles=[oracle], bench=bench)


def test_a_conforming_document_has_no_problems():
    assert schema_problems(_valid_doc()) == []


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.pop("bench"), "bench is missing"),
    (lambda d: d.update(status="fine"), "status must be one of"),
    (lambda d: d.update(passed=False), "passed=False contradicts status='ok'"),
    (lambda d: d["oracles"][0].pop("tolerance"), "oracles[0].tolerance is missing"),
    (lambda d: d["oracles"][0].update(passed=1), "oracles[0].passed must be bool"),
    (lambda d: d["oracles"][0].update(skipped=True), "oracles[0]: skipped and passed contradict each other"),
    (lambda d: d["bench"].pop("replan_over_plan_once"), "bench.replan_over_plan_once is missing"),
    (lambda d: d["bench"].update(tokens=True), "bench.tokens must be int, got bool"),
    (lambda d: d["env"].pop("git"), "env.git is missing"),
    (lambda d: d.update(status="skipped", passed=False), "status 'skipped' needs at least one entry in reasons"),
])
def test_the_checker_names_each_departure(mutate, problem):
    doc = copy.deepcopy(_valid_doc())
    mutate(doc)
    assert any(p.startswith(problem) for p in schema_problems(doc)), schema_problems(doc)
