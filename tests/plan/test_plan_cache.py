"""Persistent inductor plans end to end: across processes, through the CLI, under concurrent writers.

Each compile of the tiny model's step is an AOTInductor build (~15-30 s on 2 cores), so every test
that compiles is ``slow`` (a CI step of its own); the default run keeps the ones that do not.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan.plan_store import META, PAYLOAD
from fuelpipe.results import read_results

ONLY_PLAN_VS_REPLAN = [f"experiment.oracles.{n}.enabled=false" for n in ORACLES if n != "plan_vs_replan"]
ONLY_PLAN_CACHE = [f"experiment.oracles.{n}.enabled=false" for n in ORACLES if n != "plan_cache"]
LEAN = ["experiment=smoke", "backend=inductor", "backend.threads=1", "experiment.bench.tokens=2"]

# One build in a fresh process: the decode plan's cache event and its logits (tiny llama, seed 0).
BUILD = """
import json, sys, torch
torch.set_num_threads(1)
from models.registry import build_random_model
from fuelpipe.context import InferenceContext
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.plan_store import PlanCacheSpec
model = build_random_model("llama", "tiny", seed=0)
ctx = InferenceContext(model, BackendSpec(name="inductor", plan_cache=PlanCacheSpec(dir=sys.argv[1])))
cache = ctx.new_cache(48)
ctx.prefill(cache, [1, 2, 3])
rows = torch.cat([ctx.decode(cache, t) for t in (4, 5, 6)])
ref = InferenceContext(model, "eager"); c = ref.new_cache(48); ref.prefill(c, [1, 2, 3])
want = torch.cat([ref.decode(c, t) for t in (4, 5, 6)])
torch.save(rows, sys.argv[2])
print(json.dumps({**ctx.plan.session.program.cache_event.record(),
                  "max_abs_vs_eager": float((rows - want).abs().max())}))
"""


def _build(cache_dir, logits_path, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUILD, str(cache_dir), str(logits_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _answer(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_loads_the_stored_plan_with_bit_identical_logits(tmp_path):
    import torch

    first = _answer(_build(tmp_path / "cache", tmp_path / "a.pt"))
    second = _answer(_build(tmp_path / "cache", tmp_path / "b.pt"))
    assert first["status"] == "miss" and first["compile_s"] > 0 and first["published"] is True
    assert second["status"] == "hit" and second["key"] == first["key"] and second["compile_s"] == 0
    assert torch.equal(torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt"))
    assert first["max_abs_vs_eager"] < 1e-5


@pytest.mark.slow
def test_the_cli_reports_compile_and_cache_hits_in_results_and_the_sweep_report(tmp_path):
    cache = tmp_path / "plans"
    docs = []
    for run in ("first", "second"):
        proc = run_cli(*LEAN, *ONLY_PLAN_VS_REPLAN, f"backend.plan_cache.dir={cache}", f"hydra.run.dir={tmp_path / run}",
                       cwd=tmp_path, timeout=400)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        docs.append(read_results(tmp_path / run / "results.json"))
        assert "plan cache" in proc.stdout
    first, second = (d["bench"]["plan_cache"] for d in docs)
    # The first run's oracle compiled the plan before its benchmark, which may already hit it.
    assert first["hits"] + first["misses"] == docs[0]["bench"]["plan_builds"] >= 1
    assert (first["compile_ms"] > 0) == (first["misses"] > 0)
    assert second["misses"] == 0 and second["hits"] == docs[1]["bench"]["plan_builds"] and second["compile_ms"] == 0
    proc = run_cli("report", str(tmp_path / "second"), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header = (tmp_path / "report" / "report.csv").read_text().splitlines()[0].split(",")
    row = (tmp_path / "report" / "report.csv").read_text().splitlines()[1]
    assert "plan_compile_ms" in header and "plan_cache" in header
    job = docs[1]["plan_cache"]  # the report shows the job's every cached build (oracles' too), not the bench's alone
    assert job["misses"] == 0 and job["hits"] == job["builds"] >= second["hits"]
    assert f"{job['hits']} hit / {job['builds']}" in row


@pytest.mark.slow
def test_a_corrupt_entry_found_by_an_oracles_build_is_counted_and_reported_for_the_job(tmp_path):
    """The oracle builds first and rebuilds the corrupt entry, so the benchmark hits; the job still says it."""
    cache = tmp_path / "plans"
    first = run_cli(*LEAN, *ONLY_PLAN_VS_REPLAN, f"backend.plan_cache.dir={cache}", f"hydra.run.dir={tmp_path / 'a'}",
                    cwd=tmp_path, timeout=400)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    payloads = sorted(cache.rglob(PAYLOAD))
    assert payloads
    for path in payloads:  # one flipped byte in every stored plan
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    proc = run_cli(*LEAN, *ONLY_PLAN_VS_REPLAN, f"backend.plan_cache.dir={cache}", f"hydra.run.dir={tmp_path / 'b'}",
                   cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = read_results(tmp_path / "b" / "results.json")
    job = doc["plan_cache"]
    assert job["statuses"].get("corrupt") == len(payloads), job
    assert job["builds"] == job["hits"] + job["misses"] >= doc["bench"]["plan_builds"]
    assert len(job["rebuilt"]) == len(payloads) and all("sha256" in r for r in job["rebuilt"])
    assert doc["bench"]["plan_cache"]["statuses"].get("corrupt") is None  # the benchmark's own builds hit
    assert f"({len(payloads)} corrupt entry rebuilt)" in proc.stdout
    report = run_cli("report", str(tmp_path / "b"), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert f"({len(payloads)} corrupt)" in report.stdout


@pytest.mark.slow
def test_ctrl_c_while_a_plan_is_being_compiled_leaves_nothing_half_written_in_the_cache(tmp_path):
    """SIGINT lands during the AOT compile of the first decode step: exit 130, and the folder holds only
    whole entries (no staging folder left behind)."""
    from models.registry import build_random_model
    from _support.cli_runs import Cli, check_clean_stop
    from _support.weights_helpers import write_llama_gguf

    gguf = write_llama_gguf(tmp_path / "tiny.gguf", build_random_model("llama", "tiny", seed=5))
    cache = tmp_path / "plans"
    cli = Cli("model=llama_tiny", "model.weights=gguf", f"model.path={gguf}", "experiment=generate",
              "backend=inductor", "backend.threads=1", f"backend.plan_cache.dir={cache}", "max_new_tokens=8",
              f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    cli.wait_for("plan cache: compiling entry", timeout=300)
    time.sleep(2.0)  # inside the compile
    check_clean_stop(cli, cli.ctrl_c(timeout=300))
    assert read_results(tmp_path / "run" / "results.json")["status"] == "interrupted"
    entries = [p for p in (cache / "v1").iterdir() if p.name != ".tmp"]
    assert all(sorted(q.name for q in e.iterdir()) == [META, PAYLOAD] for e in entries), entries
    assert not (cache / "v1" / ".tmp").exists() or list((cache / "v1" / ".tmp").iterdir()) == []


@pytest.mark.parametrize("overrides, says", [
    (["plan.offset_mode=symbol"], "offset path is 'symbol'"),
    (["backend.plan_cache.max_gb=0"], "max_gb must be > 0"),
])
def test_a_plan_cache_it_cannot_serve_exits_2_naming_why(tmp_path, overrides, says):
    proc = run_cli(*LEAN, f"backend.plan_cache.dir={tmp_path / 'plans'}", *overrides, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("inject", [False, True], ids=["gate", "negative_control"])
def test_the_plan_cache_oracle_passes_and_catches_a_key_without_weights(tmp_path, inject):
    proc = run_cli(*LEAN, *ONLY_PLAN_CACHE, "experiment.bench.enabled=false", f"backend.plan_cache.dir={tmp_path / 'p'}",
                   f"experiment.oracles.plan_cache.inject_fault={str(inject).lower()}",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=600)
    doc = read_results(tmp_path / "run" / "results.json")
    result = next(o for o in doc["oracles"] if o["name"] == "plan_cache")
    if inject:
        assert proc.returncode == 1 and not result["passed"]
        assert "other weights: another entry" in result["detail"]
    else:
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert result["passed"] and result["metric"]["checks"] == 18  # 9 on the key (any backend) + 9 on stored plans
    # The oracle works in a private folder: the configured one is left as it was (nothing written).
    assert not (tmp_path / "p" / "v1").exists() or not any((tmp_path / "p" / "v1").iterdir())


@pytest.mark.slow
def test_two_processes_building_one_plan_at_once_leave_one_entry_and_both_are_right(tmp_path):
    import torch

    procs = [_build(tmp_path / "cache", tmp_path / f"{i}.pt") for i in range(2)]
    answers = [_answer(p, timeout=600) for p in procs]
    assert answers[0]["key"] == answers[1]["key"]
    assert sorted(a["published"] for a in answers if a["status"] != "hit") in ([False, True], [True])
    assert all(a["max_abs_vs_eager"] < 1e-5 for a in answers)
    assert torch.equal(torch.load(tmp_path / "0.pt"), torch.load(tmp_path / "1.pt"))
    entries = [p.name for p in (tmp_path / "cache" / "v1").iterdir() if not p.name.startswith(".")]
    assert entries == [answers[0]["key"]]
    assert list((tmp_path / "cache" / "v1" / ".tmp").iterdir()) == []
    third = _answer(_build(tmp_path / "cache", tmp_path / "2.pt"))
    assert third["status"] == "hit"


def test_a_symbol_path_variant_is_built_uncached_and_says_so(tmp_path):
    """The config refuses a plan cache on the symbol path; a variant an oracle builds there compiles uncached."""
    from fuelpipe.plan.backends import BackendSpec, build_program
    from fuelpipe.plan.plan_store import PlanCacheSpec
    from fuelpipe.step import step_module_for
    from models.registry import build_random_model

    spec = BackendSpec(name="inductor", plan_cache=PlanCacheSpec(dir=str(tmp_path)))
    model = build_random_model("llama", "tiny", seed=0)
    symbol = build_program(spec, step_module_for(model, "symbol"), "symbol")
    assert symbol.cache_event.status == "uncacheable" and symbol.counter is not None  # torch.compile's program
    tensor = build_program(spec, step_module_for(model, "tensor"), "tensor")
    assert tensor.cache_event.status == "" and tensor.counter is None  # keyed, loaded or compiled on first call


def test_an_aot_symbol_path_variant_runs_on_the_traced_step_without_a_compile(tmp_path):
    """aot never serves the symbol path: an oracle's variant there is the fx trace (no compile), and says so."""
    from fuelpipe.plan.backends import BackendSpec, build_program
    from fuelpipe.plan.plan_store import PlanCacheSpec
    from fuelpipe.step import step_module_for
    from models.registry import build_random_model

    spec = BackendSpec(name="aot", plan_cache=PlanCacheSpec(dir=str(tmp_path)))
    model = build_random_model("llama", "tiny", seed=0)
    symbol = build_program(spec, step_module_for(model, "symbol"), "symbol")
    assert symbol.backend == "fx" and symbol.counter is None and not symbol.compiles_on_first_call
    assert symbol.cache_event.status == "uncacheable" and "fx" in symbol.cache_event.detail
    assert list(tmp_path.iterdir()) == []  # nothing stored


@pytest.mark.parametrize("value, says", [
    ("''", "empty string"),
    ("{file}/sub", "is a file, not a folder"),
])
def test_an_unusable_cache_folder_exits_2_before_anything_runs(tmp_path, value, says):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_cli(*LEAN, f"backend.plan_cache.dir={value.format(file=blocker)}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def test_a_plan_cache_on_a_backend_that_compiles_nothing_is_said_to_be_unused(tmp_path):
    proc = run_cli("experiment=smoke", "backend=fx", "backend.threads=1", "experiment.bench.tokens=2",
                   *ONLY_PLAN_VS_REPLAN, f"backend.plan_cache.dir={tmp_path / 'p'}", f"hydra.run.dir={tmp_path / 'r'}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pc = read_results(tmp_path / "r" / "results.json")["bench"]["plan_cache"]
    assert "backend=fx compiles nothing" in pc["unused"]
    assert "plan cache       not used" in proc.stdout
    assert "backend.plan_cache is set but" in proc.stdout + proc.stderr  # the run's warning
