"""A sweep with a planted crash, and the checks every launcher must pass with it (tests/cli/test_cli_sweep.py,
tests/cli/test_launchers.py).

The crash is test-only: ``tests/_support/plugins/planted_crash`` is a folder with an experiment stage and the
``.dist-info`` that registers it (entry-point group ``fuelpipe.stages``). ``planted`` puts it on
PYTHONPATH, which every process of the sweep inherits, and marks the environment with a value of the
test's own, so that any process the sweep started can be found after the CLI has exited.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import psutil

from conftest import ROOT, run_cli
from fuelpipe.results import schema_problems
from _support.cli_runs import LEAN

PLUGIN = ROOT / "tests" / "_support" / "plugins" / "planted_crash"
MARK = "FUELPIPE_TEST_SWEEP_MARK"
# 4 jobs: ok, crashed (SIGSEGV in the job), and the invalid kv=latent twice (skipped)
CRASH_AXES = ("kv=contiguous,latent", "experiment.planted_crash.signal=none,SIGSEGV", "backend=eager", *LEAN,
              "experiment.bench.enabled=false")
INVALID = "kv=latent needs an MLA model family; model.family=llama is not MLA"


def planted(monkeypatch) -> str:
    """Put the planted-crash stage on every sweep process's path; the marker their environment carries."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(MARK, marker)
    return marker


def marked_processes(marker: str, sweep: Path) -> list[str]:
    """Live processes (not this one) started by the sweep: their environment carries ``marker``, or their
    command line names the sweep's folder (a job's process on a joined Ray cluster, whose workers have
    the cluster's environment)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(p.info["cmdline"] or [])
            ours = p.environ().get(MARK) == marker or str(sweep) in cmdline
            if ours and p.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid}: {cmdline}")
    return found


def docs_of(sweep: Path) -> list[dict]:
    docs = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert all(schema_problems(d) == [] for d in docs), [schema_problems(d) for d in docs]
    return docs


def check_crash_sweep(proc, sweep: Path, marker: str, tmp_path: Path, signal: str = "SIGSEGV") -> dict:
    """Every job ran to its end and wrote results.json; the crash is its job's status with its overrides and
    signal; the table and ``fuelpipe report`` show all jobs; exit 1; no process of the sweep is left."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    docs = docs_of(sweep)
    by_status: dict[str, list[dict]] = {}
    for d in docs:
        by_status.setdefault(d["status"], []).append(d)
    assert sorted((s, len(v)) for s, v in by_status.items()) == [("crashed", 1), ("ok", 1), ("skipped", 2)], out[-3000:]
    crashed = by_status["crashed"][0]
    assert f"experiment.planted_crash.signal={signal}" in crashed["overrides"]
    assert "kv=contiguous" in crashed["overrides"]
    assert crashed["crash"]["signal"] == signal and signal in crashed["reasons"][0]
    assert all(INVALID in d["reasons"] for d in by_status["skipped"])
    assert "sweep: 4 jobs, crashed 1, ok 1, skipped 2" in proc.stdout
    assert f"killed by {signal}" in proc.stderr  # the CLI names the crashed job and its signal
    report = run_cli("report", str(sweep), "--out", str(tmp_path / "report"), cwd=tmp_path, timeout=120)
    table = (tmp_path / "report" / "report.md").read_text().splitlines()
    assert report.returncode == 0 and len(table) == 2 + 4
    assert sum("| crashed |" in row and signal in row for row in table) == 1
    assert marked_processes(marker, sweep) == []
    return crashed
