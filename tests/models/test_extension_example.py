"""The out-of-tree family in examples/mistral_sw, installed as a user would, gated by the CLI and by its own pytest.

The package is built from a copy of the example and installed with pip into a
temporary folder put on PYTHONPATH (the test environment itself is not
changed); every run is a subprocess, so entry points are discovered exactly as
after ``pip install``. With ``MISTRAL_SW_PLANTED_BUG=1`` the family carries a
stale memoised weight (see its model.py); both gates must then fail with the
oracle's own account.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import with_tiny_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mistral_sw"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mistral_sw")
    src = root / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    # The installed setuptools builds it when there is one (fast, offline); else pip's isolated build.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target", str(target), str(src)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return target


def _env(site: Path, planted: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("MISTRAL_SW_PLANTED_BUG", None)
    if planted:
        env["MISTRAL_SW_PLANTED_BUG"] = "1"
    return env


def _cli(site: Path, out: Path, *overrides: str, planted: bool = False, experiment: str = "parity"
         ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fuelpipe", *with_tiny_model(["model=mistral_sw_tiny", f"experiment={experiment}",
                                                             f"hydra.run.dir={out}", *overrides])],  # fx unless named
        env=_env(site, planted), capture_output=True, text=True, timeout=600, cwd=out.parent,
    )


def _example_pytest(site: Path, planted: bool = False, *select: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select, str(EXAMPLE / "tests")],
        env=_env(site, planted), capture_output=True, text=True, timeout=600, cwd=EXAMPLE,
    )


def test_the_family_passes_the_parity_gate_through_the_cli(site, tmp_path):
    run = _cli(site, tmp_path / "run")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["status"] == "ok" and doc["model"]["family"] == "mistral_sw"
    verdicts = {o["name"]: ("skip" if o.get("skipped") else o["passed"]) for o in doc["oracles"]}
    assert verdicts.pop("vs_transformers") == "skip"  # no transformers twin: said so, never a pass
    assert verdicts.pop("quant_quality") == "skip"  # nor quantized weights
    assert len(verdicts) >= 12 and all(v is True for v in verdicts.values()), verdicts


@pytest.mark.slow
def test_the_family_passes_the_gate_on_a_ring_cache_and_every_negative_control_is_caught(site, tmp_path):
    """kv=ring (fuelpipe/kv/ring.py) serves a family it has never seen: every layer keeps only its window."""
    run = _cli(site, tmp_path / "run", "kv=ring")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["status"] == "ok" and doc["config"]["kv"]["layout"] == "ring"
    ran = [o for o in doc["oracles"] if not o.get("skipped")]
    assert len(ran) >= 13 and all(o["passed"] for o in ran), [o["name"] for o in ran if not o["passed"]]
    control = _cli(site, tmp_path / "control", "kv=ring", experiment="negative_control")
    assert control.returncode == 1, control.stdout + control.stderr
    doc = json.loads((tmp_path / "control" / "results.json").read_text())
    uncaught = [o["name"] for o in doc["oracles"] if o["passed"] and not o.get("skipped")]
    assert not uncaught, f"negative controls not caught on kv=ring: {uncaught}"


def test_the_planted_bug_fails_the_cli_gate_with_the_oracles_detail(site, tmp_path):
    run = _cli(site, tmp_path / "run", planted=True)
    assert run.returncode == 1, run.stdout + run.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    failed = {o["name"]: o["detail"] for o in doc["oracles"] if not o["passed"] and not o.get("skipped")}
    assert "key_sensitivity" in failed, failed
    detail = failed["key_sensitivity"]
    # every weight change is served by the stale memo: each rebuilt plan differs from a clean instance's
    for mutation in ("deep-copy twin", "copy_", "data_assign", "module_swap", "load_state_dict"):
        assert f"{mutation}: logits equal a clean instance's" in detail, detail
    assert "key_sensitivity       FAIL" in run.stdout


def test_the_familys_own_pytest_file_passes_through_the_plugin(site):
    run = _example_pytest(site)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


def test_the_planted_bug_fails_the_familys_pytest_with_the_oracles_account(site):
    # The oracle the bug is planted against, on every combination (the clean run above runs them all).
    run = _example_pytest(site, True, "-k", "key_sensitivity")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "OracleFailure: oracle key_sensitivity FAIL" in run.stdout
    assert "detail: failed: deep-copy twin: logits equal a clean instance's" in run.stdout
    assert "metrics: checks=" in run.stdout


def test_the_example_touches_nothing_under_fuelpipe_or_models():
    """The family is added with zero edits to the framework: no file there names it."""
    hits = [str(p.relative_to(REPO)) for folder in ("fuelpipe", "models") for p in (REPO / folder).rglob("*.py")
            if "mistral_sw" in p.read_text()]
    assert hits == []
