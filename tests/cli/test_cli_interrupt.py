"""Ctrl-C through the real CLI: a clean stop (no traceback), the partial output marked ``interrupted``, exit 130.

The CLI runs in a session of its own and SIGINT goes to its whole process group, as a terminal's Ctrl-C
does. The tiny GGUF Llama (it has a tokenizer, so it generates text) decodes with ``plan=replan`` (a
plan build per token), slow enough for the signal to land mid-generation.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from fuelpipe.results import read_results, schema_problems
from models.registry import build_random_model
from _support.cli_runs import Cli, check_clean_stop
from _support.weights_helpers import write_llama_gguf

SLOW_GENERATION = ["experiment=generate", "plan=replan", "backend=fx", "backend.threads=1", "max_new_tokens=400",
                   "prompt=Count slowly"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


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
    from _support.sweep_fault_helpers import MARK, marked_processes

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
    from _support.sweep_fault_helpers import MARK, marked_processes

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


def test_ctrl_c_while_starting_exits_130_saying_nothing_ran(tmp_path):
    """Ctrl-C in the first second (torch and Hydra import, the command line checked): no traceback."""
    cli = Cli("model=llama_tiny", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    time.sleep(1.0)
    check_clean_stop(cli, cli.ctrl_c())
    assert "nothing ran" in cli.stderr and not (tmp_path / "run").exists()


# (phase line the run logs, seconds to wait after it, the run's arguments); each run stops in that phase.
# (The tiny models load in milliseconds: the load phase builds a 1 GB random model of the tiny Llama's family,
# seconds of work, to land Ctrl-C in it; the generation test covers decode.)
BIG_RANDOM = ["+model.overrides.hidden_size=1024", "+model.overrides.intermediate_size=4096",
              "+model.overrides.num_hidden_layers=16"]
PHASES = {
    "load": ("phase: load", 0.5, BIG_RANDOM),
    "oracle": ("phase: oracle batch_vs_solo", 0.3, ["backend=eager"]),  # the gate's longest on a tiny model
    "benchmark": ("phase: benchmark", 1.0, ["backend=fx", "experiment=bench", "experiment.bench.tokens=480"]),
    "inductor-compile": ("phase: compile (backend=inductor", 1.0, ["backend=inductor", "experiment=bench"]),
    "aot-compile": ("phase: compile (backend=aot", 3.0, ["backend=aot", "experiment=bench"]),
}


@pytest.mark.parametrize("phase", [p if p not in ("load", "inductor-compile", "aot-compile")
                                   else pytest.param(p, marks=pytest.mark.slow) for p in PHASES])
def test_ctrl_c_in_each_phase_stops_within_the_bound_marked_interrupted(tmp_path, phase):
    line, after, args = PHASES[phase]
    run = tmp_path / "run"
    cli = Cli("model=llama_tiny", *args, f"hydra.run.dir={run}", cwd=tmp_path)
    cli.wait_for(line)
    time.sleep(after)
    check_clean_stop(cli, cli.ctrl_c())
    doc = read_results(run / "results.json")
    assert schema_problems(doc) == [] and doc["status"] == "interrupted" and doc["passed"] is False
    assert cli.stdout.count(f"results: {run / 'results.json'}") == 1, cli.stdout[-2000:]
    assert "cannot run" not in cli.stdout  # an interrupted run is not a combination that cannot run
    if phase == "load":  # stopped before anything was generated
        assert not doc.get("generation"), doc.get("generation")
    if phase == "oracle":  # the oracles that finished are kept, the one running is not
        # (on a fast machine batch_vs_solo can finish before the signal lands: the one running is the last
        # oracle phase the run logged)
        started = re.findall(r"phase: oracle (\w+)", cli.stdout)
        names = [o["name"] for o in doc["oracles"]]
        assert "batch_vs_solo" in started and started[-1] not in names, (started, names)
        assert set(started[:-1]) <= set(names) and "config_variants" in names, (started, names)
    assert [p.name for p in run.iterdir() if "tmp" in p.name] == []


def test_ctrl_c_in_a_kernel_build_leaves_no_half_built_library(tmp_path):
    """The C++ kernels' first build (about 15 s) stops at once; the next run builds them again."""
    cache = tmp_path / "kernels"
    cli = Cli("model=llama_tiny", "backend=fx", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
              env=dict(os.environ, FUELPIPE_KERNEL_CACHE=str(cache)))
    cli.wait_for("phase: kernel build")
    time.sleep(1.0)  # the compiler is running
    check_clean_stop(cli, cli.ctrl_c())
    assert read_results(tmp_path / "run" / "results.json")["status"] == "interrupted"
    assert list(cache.rglob("*.so")) == [] and list(cache.rglob("lock")) == []  # nothing to load, no stale lock


@pytest.mark.slow
def test_ctrl_c_while_oracle_workers_compile_stops_them_too(tmp_path):
    """config_variants on aot compiles in worker processes (each leading its own process group): Ctrl-C
    stops the run and leaves neither a worker nor anything a worker started (its C++ compilers)."""
    from fuelpipe.oracles.registry import ORACLES

    others = [f"experiment.oracles.{n}.enabled=false" for n in ORACLES.names() if n != "config_variants"]
    env = dict(os.environ, FUELPIPE_CACHE_DIR=str(tmp_path / "plans"))
    cli = Cli("model=llama_tiny", "backend=aot", "experiment.bench.enabled=false", *others,
              f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    cli.wait_for("phase: oracle config_variants")

    def pids(*args: str) -> list[str]:
        return subprocess.run(["pgrep", *args], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 60
    while not (workers := pids("-P", str(cli.proc.pid), "-f", "multiprocessing.spawn")):
        assert time.monotonic() < deadline, "expected the oracle's worker processes to start"
        time.sleep(0.2)
    time.sleep(3.0)  # they are importing torch or compiling
    check_clean_stop(cli, cli.ctrl_c())
    assert read_results(tmp_path / "run" / "results.json")["status"] == "interrupted"
    time.sleep(1.0)
    assert [pid for w in workers for pid in pids("-g", w)] == []  # no worker, no compiler of theirs
