"""Ctrl-C through the real CLI: a clean stop (no traceback), the partial output marked ``interrupted``, exit 130.

The CLI runs in a session of its own and SIGINT goes to its whole process group, as a terminal's Ctrl-C
does. The tiny GGUF Llama (it has a tokenizer, so it generates text) decodes with ``plan=replan`` (a
plan build per token), slow enough for the signal to land mid-generation.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from fuelpipe.results import read_results, schema_problems
from models.registry import build_random_model
from weights_helpers import write_llama_gguf

SLOW_GENERATION = ["experiment=generate", "plan=replan", "backend=fx", "backend.threads=1", "max_new_tokens=400",
                   "prompt=Count slowly"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


class Cli:
    """``python -m fuelpipe ARGS`` in its own session, its output gathered as it comes."""

    def __init__(self, *args: str, cwd: Path, env: dict | None = None) -> None:
        env = dict(env or os.environ, CI="true",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "fuelpipe", *args], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.out, self.err = [], []
        self._readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, into: list) -> None:
        for chunk in iter(lambda: stream.read(1), ""):
            into.append(chunk)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            assert self.proc.poll() is None, (f"exited {self.proc.returncode} first: "
                                              f"{self.stdout[-2000:]}{self.stderr[-3000:]}")
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s: {self.stdout[-2000:]}"
            time.sleep(0.1)

    def ctrl_c(self, timeout: float = 120) -> int:
        """SIGINT to the whole process group, as a terminal sends it; the exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=timeout)
        for r in self._readers:
            r.join(timeout=10)
        return code


def check_clean_stop(cli: Cli, code: int) -> None:
    assert code == 130, cli.stdout[-2000:] + cli.stderr[-3000:]
    assert "Traceback" not in cli.stdout + cli.stderr, cli.stderr[-3000:]
    assert "interrupted (Ctrl-C)" in cli.stderr


def test_ctrl_c_during_generate_stops_cleanly_and_keeps_the_text_marked_interrupted(tmp_path, tiny_gguf):
    run = tmp_path / "run"
    cli = Cli("model=llama_tiny", "model.weights=gguf", f"model.path={tiny_gguf}", *SLOW_GENERATION,
              f"hydra.run.dir={run}", cwd=tmp_path)
    cli.wait_for("--- Count slowly\n")
    time.sleep(3.0)  # a few tokens in
    check_clean_stop(cli, cli.ctrl_c())
    assert "--- [interrupted]" in cli.stdout  # the streamed text ends visibly
    doc = read_results(run / "results.json")
    assert schema_problems(doc) == [] and doc["status"] == "interrupted" and doc["passed"] is False
    gen = doc["generation"]
    assert gen["interrupted"] is True and 1 <= gen["new_tokens"] < 400 and len(gen["tokens"]) == gen["new_tokens"]
    assert doc["model"]["family"] == "llama"
    assert [p.name for p in run.iterdir() if "tmp" in p.name] == []  # results.json was written whole


@pytest.mark.slow  # ~30 s: two interpreters (the CLI, the job's own process) on a loaded 2-core machine
def test_ctrl_c_during_a_sweep_stops_it_marks_the_running_job_and_starts_no_other(tmp_path, tiny_gguf):
    from sweep_fault_helpers import MARK, marked_processes

    marker = "ctrl-c-" + os.urandom(6).hex()
    sweep = tmp_path / "sweep"
    cli = Cli("-m", "model=llama_tiny", "model.weights=gguf", f"model.path={tiny_gguf}", *SLOW_GENERATION,
              "experiment.seed=1,2", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=dict(os.environ, **{MARK: marker}))
    cli.wait_for("--- Count slowly\n")
    time.sleep(3.0)
    check_clean_stop(cli, cli.ctrl_c())
    docs = [read_results(p) for p in sorted(sweep.rglob("results.json"))]
    assert [d["status"] for d in docs] == ["interrupted"]  # the second job never started
    assert docs[0]["generation"]["interrupted"] is True and schema_problems(docs[0]) == []
    assert "sweep: 1 jobs, interrupted 1" in cli.stdout
    assert marked_processes(marker, sweep) == []


@pytest.mark.slow  # three interpreters: the CLI, a loky worker, the job's own process
def test_ctrl_c_during_a_joblib_sweep_is_a_stop_not_a_lost_worker(tmp_path, tiny_gguf):
    """SIGINT reaches loky's workers and the jobs' processes too: the sweep stops (exit 130, the running jobs
    marked), never taking the stop for a lost worker and running jobs again, and nothing is left running."""
    from sweep_fault_helpers import MARK, marked_processes

    marker = "ctrl-c-" + os.urandom(6).hex()
    sweep = tmp_path / "sweep"
    cli = Cli("-m", "hydra/launcher=joblib_local", "model=llama_tiny", "model.weights=gguf", f"model.path={tiny_gguf}",
              *SLOW_GENERATION, "experiment.seed=1,2,3", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
              env=dict(os.environ, **{MARK: marker}))
    cli.wait_for("--- Count slowly\n")
    time.sleep(3.0)
    check_clean_stop(cli, cli.ctrl_c())
    assert "lost its worker" not in cli.stdout + cli.stderr and "a worker was lost" not in cli.stdout + cli.stderr
    docs = [read_results(p) for p in sorted(sweep.rglob("results.json"))]
    assert docs and all(d["status"] == "interrupted" for d in docs), [d["status"] for d in docs]
    assert len(docs) <= 2  # the third job never started
    assert marked_processes(marker, sweep) == []
