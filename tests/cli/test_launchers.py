"""Sweeps on real distributed launchers through the real CLI: Ray (fuelpipe's own launcher) and submitit.

Ray: a sweep joins a Ray head this test starts (``address=auto``), and another starts and stops its
own local instance. submitit: hydra-submitit-launcher's local executor, the code path SLURM uses.
Without ray or submitit installed these tests skip, except under CI=true (CI installs the test extra).
Each starts Ray or submitit processes (~20-40 s on 2 cores): ``slow``, a CI step of their own.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, run_cli
from fuelpipe.results import schema_problems
from _support.sweep_fault_helpers import CRASH_AXES, check_crash_sweep, docs_of, marked_processes, planted
from _support.cli_runs import LEAN

pytestmark = pytest.mark.slow

INVALID = "kv=latent needs an MLA model family; model.family=llama is not MLA"


def need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"not installed: {', '.join(missing)} (pip install -e \".[ray,submitit]\")"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI installs the test extra, which includes them")
        pytest.skip(reason)


def statuses(sweep: Path) -> dict[str, dict]:
    """results.json of every job of a sweep by kv layout, each checked against the schema."""
    docs = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert all(schema_problems(d) == [] for d in docs)
    return {d["config"]["kv"]["layout"]: d for d in docs}


def check_valid_and_skipped(proc, sweep: Path) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    docs = statuses(sweep)
    assert sorted(docs) == ["contiguous", "latent"]
    assert docs["contiguous"]["status"] == "ok" and docs["contiguous"]["passed"] is True
    skipped = docs["latent"]
    assert skipped["status"] == "skipped" and INVALID in skipped["reasons"]
    assert "sweep: 2 jobs, ok 1, skipped 1" in proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head(log: Path):
    """A Ray head on a free port, for this test only: yields its address; stops it whatever happens.

    ``ray start --block`` in its own session: SIGTERM makes it stop what it started, and whatever is
    left of its process group is killed. Only the processes this test started are stopped
    (``ray stop`` would stop every Ray instance on the machine).
    Its workers import the checkout under test (PYTHONPATH), as a cluster node has fuelpipe installed.
    """
    temp_dir = tempfile.mkdtemp(prefix="fpray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")  # SIGTERM: stop now, no 30 s drain
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={free_port()}", "--num-cpus=2",
           f"--dashboard-agent-listen-port={free_port()}",  # not the fixed default another Ray may hold
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}", "--block"]
    with open(log, "w") as out:
        head = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address_file = Path(temp_dir) / "ray_current_cluster"
        deadline = time.monotonic() + 90
        while not (address_file.is_file() and address_file.read_text().strip()):
            assert head.poll() is None, f"ray start exited {head.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no Ray head after 90 s: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield address_file.read_text().strip()
    finally:
        stop_group(head)
        assert not ray_processes(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc`` (``ray start --block`` then stops what it started), then SIGKILL its process group
    (it was started with start_new_session) if anything is left after 30 s."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    deadline = time.monotonic() + 40
    while _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        assert time.monotonic() < deadline, "the Ray head's processes outlived SIGKILL"
        time.sleep(0.5)
    proc.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def ray_processes(temp_dir: str) -> list[str]:
    """Command lines of the live processes of the Ray instance whose temp dir is ``temp_dir``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if temp_dir in cmdline and p.pid != os.getpid():
            found.append(cmdline)
    return found


@pytest.fixture
def ray_env(monkeypatch):
    _ray_env(monkeypatch)


def _ray_env(monkeypatch) -> None:
    """Ray installed, and the environment every Ray process of the test inherits: no usage stats, and
    token authentication with a token of the test's own (Ray's default reads ~/.ray/auth_token, and a
    driver joining a cluster started elsewhere may not know the cluster wants a token)."""
    need("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_ray_sweep_joins_a_running_cluster_and_skips_the_invalid_combination(tmp_path, monkeypatch, ray_env):
    sweep = tmp_path / "sweep"
    with ray_head(tmp_path / "ray_head.log") as address:
        monkeypatch.setenv("RAY_ADDRESS", address)  # how `auto` finds the cluster on a cluster node
        proc = run_cli(
            "-m", "hydra/launcher=ray_cluster", "hydra.launcher.address=auto", "kv=contiguous,latent",
            "backend=eager", *LEAN, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=180,
        )
    check_valid_and_skipped(proc, sweep)
    assert f"Ray: joined the cluster at {address}" in proc.stdout
    assert "Ray is launching 2 jobs (num_cpus=1, num_gpus=0 each)" in proc.stdout
    assert "#1 : kv=latent backend=eager" in proc.stdout
    assert "(execute_job pid=" in proc.stdout  # the jobs' output, forwarded from the Ray workers

    out = tmp_path / "report"
    report = run_cli("report", str(sweep), "--out", str(out), cwd=tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr
    table = (out / "report.md").read_text().splitlines()
    assert len(table) == 2 + 2 and "\n".join(table) in report.stdout
    assert any(row.startswith("| kv=latent | skipped |") for row in table)


def test_ray_local_instance_is_stopped_and_a_failing_job_exits_as_under_joblib(tmp_path, ray_env):
    """``address: null``: the launcher starts its own instance and stops it; a failed oracle exits 1 as joblib's."""
    fault = ("experiment.oracles.plan_vs_replan.inject_fault=false,true", "backend=eager", *LEAN,
             "experiment.bench.enabled=false")
    temp_dir = tempfile.mkdtemp(prefix="fpray", dir="/tmp")
    procs = {}
    for launcher, extra in (("ray_cluster", ["+hydra.launcher.init._temp_dir=" + temp_dir]), ("joblib_local", [])):
        procs[launcher] = run_cli("-m", f"hydra/launcher={launcher}", *fault, *extra,
                                  f"hydra.sweep.dir={tmp_path / launcher}", cwd=tmp_path, timeout=180)
    ray, joblib = procs["ray_cluster"], procs["joblib_local"]
    assert ray.returncode == joblib.returncode == 1, ray.stdout[-3000:] + ray.stderr[-3000:]
    for proc in (ray, joblib):
        assert "sweep: 2 jobs, failed 1, ok 1" in proc.stdout
    assert "Ray: started a local instance at " in ray.stdout and "Ray: local instance shut down" in ray.stdout
    assert list(Path(temp_dir).glob("session_*"))  # the instance ran there (init._temp_dir reached ray.init)
    assert not ray_processes(temp_dir)  # and nothing of it outlived the sweep
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_submitit_local_sweep_runs_each_job_from_its_job_folder(tmp_path):
    need("submitit", "hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "hydra/launcher=submitit_localhost", "kv=contiguous,latent", "backend=eager", *LEAN,
        f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=180,
    )
    check_valid_and_skipped(proc, sweep)
    assert f"Submitit 'local' sweep output dir : {sweep}" in proc.stdout
    job_dirs = [d for d in (sweep / ".submitit").iterdir() if d.name != "%j"]
    assert len(job_dirs) == 2  # one folder per job: the pickled job, its log and its pickled result
    for d in job_dirs:
        assert {p.name.split("_", 1)[1] for p in d.iterdir()} >= {"submitted.pkl", "0_result.pkl", "0_log.out"}
    assert "validated against ConfigStore schema" not in proc.stderr  # shadows none of the plugin's configs


@pytest.mark.parametrize("launcher", ["basic", "joblib_local", "submitit_localhost", "ray_cluster"])
def test_a_job_killed_by_a_signal_is_its_status_under_every_launcher(tmp_path, monkeypatch, launcher):
    """One job dies of SIGSEGV, one is valid, two are invalid: each is its own status, the sweep exits 1,
    and nothing the sweep started (Ray's local instance included) outlives it."""
    need(*{"submitit_localhost": ("submitit", "hydra_plugins.hydra_submitit_launcher"),
           "ray_cluster": ("ray",)}.get(launcher, ()))
    if launcher == "ray_cluster":
        _ray_env(monkeypatch)
    marker = planted(monkeypatch)
    sweep = tmp_path / "sweep"
    proc = run_cli("-m", f"hydra/launcher={launcher}", *CRASH_AXES, f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                   timeout=400)
    check_crash_sweep(proc, sweep, marker, tmp_path)


@pytest.mark.parametrize("launcher", ["joblib_local", "submitit_localhost", "ray_cluster"])
def test_a_worker_lost_mid_job_is_that_jobs_status_and_the_others_run_on(tmp_path, monkeypatch, launcher):
    """The job kills its watcher (the launcher's worker) with SIGKILL, as an OOM kill of the worker would: the
    job's process dies with it, the launcher learns the job is lost and records it; the other jobs run to
    their end (under joblib, loky stops the whole pool when one worker dies: the jobs it stopped run again),
    and nothing the sweep started outlives it."""
    need(*{"submitit_localhost": ("submitit", "hydra_plugins.hydra_submitit_launcher"),
           "ray_cluster": ("ray",)}.get(launcher, ()))
    if launcher == "ray_cluster":
        _ray_env(monkeypatch)
    marker = planted(monkeypatch)
    sweep = tmp_path / "sweep"
    proc = run_cli("-m", f"hydra/launcher={launcher}", *CRASH_AXES, "experiment.planted_crash.signal=none,SIGKILL",
                   "experiment.planted_crash.target=watcher", f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    docs = docs_of(sweep)
    assert sorted(d["status"] for d in docs) == ["crashed", "ok", "skipped", "skipped"]
    lost = next(d for d in docs if d["status"] == "crashed")
    assert "experiment.planted_crash.signal=SIGKILL" in lost["overrides"] and "kv=contiguous" in lost["overrides"]
    assert lost["crash"]["signal"] is None and "its worker died" in lost["reasons"][0]
    ok = next(d for d in docs if d["status"] == "ok")
    assert "experiment.planted_crash.signal=none" in ok["overrides"] and ok["oracles"]  # it ran to its end
    assert "sweep: 4 jobs, crashed 1, ok 1, skipped 2" in proc.stdout
    assert marked_processes(marker, sweep) == []


def test_a_crash_on_a_joined_ray_cluster_is_that_jobs_status(tmp_path, monkeypatch):
    _ray_env(monkeypatch)
    marker = planted(monkeypatch)  # the head's workers import the planted stage too, as a cluster node would
    sweep = tmp_path / "sweep"
    with ray_head(tmp_path / "ray_head.log") as address:
        monkeypatch.setenv("RAY_ADDRESS", address)
        proc = run_cli("-m", "hydra/launcher=ray_cluster", "hydra.launcher.address=auto", *CRASH_AXES,
                       f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=400)
        assert not [p for p in marked_processes(marker, sweep) if "fuelpipe" in p]  # no job left on the cluster
    check_crash_sweep(proc, sweep, marker, tmp_path)
