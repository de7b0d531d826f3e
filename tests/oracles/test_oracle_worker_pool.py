"""An oracle's independent checks in worker processes: the same answers as in-process, builds counted, and a
pool that cannot run costs time, never a check."""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from fuelpipe.oracles import config_variants
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.child_process import WORKER_IGNORES_SIGINT
from fuelpipe.oracles.worker_pool import CheckPool, run_checks, worker_count
from fuelpipe.plan import build_tally
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one


def _square(n: int) -> dict:
    return {"n": n, "square": n * n}


def _square_where(n: int) -> dict:
    return {**_square(n), "pid": os.getpid()}


def test_workers_answer_every_job_in_order_from_other_processes(caplog):
    jobs = {f"job {i}": i for i in (3, 1, 2)}
    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        got = run_checks(_square_where, jobs, workers=2)
    assert list(got) == ["job 3", "job 1", "job 2"]
    assert [{k: v for k, v in r.items() if k != "pid"} for r in got.values()] == [_square(i) for i in (3, 1, 2)]
    assert all(r["pid"] != os.getpid() for r in got.values()) and caplog.text == ""


def test_a_pool_that_cannot_run_falls_back_to_this_process(caplog):
    def local_check(n: int) -> dict:  # a local function does not pickle: the pool cannot take it
        return {"n": n + 1}

    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        got = run_checks(local_check, {"a": 1, "b": 2}, workers=2)
    assert got == {"a": {"n": 2}, "b": {"n": 3}}
    assert "running 2 check(s) in this process" in caplog.text


def test_a_check_that_raises_in_a_worker_raises_here():
    with pytest.raises(ZeroDivisionError):
        run_checks(_one_over, {"ok": 1, "bad": 0}, workers=2)


def _one_over(n: int) -> dict:
    return {"x": 1 / n}


def _ignores_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads a process's signal dispositions in /proc")
def test_a_ctrl_c_reaching_starting_workers_neither_kills_them_nor_prints_a_traceback(capfd, caplog):
    """A worker is born in this process's group, so a terminal's Ctrl-C reaches it until its start-up
    imports (seconds on a loaded machine) have run the initializer. From its first ``import fuelpipe`` on
    (milliseconds after its interpreter starts) it ignores SIGINT: SIGINT sent over and over from then on,
    through its imports, and each worker still answers its check and nothing is printed."""
    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        pool = CheckPool(_square_where, {"a": 2, "b": 3}, workers=2)
        workers = [proc.pid for proc in pool._pool._processes.values()]
        assert len(workers) == 2
        deadline = time.monotonic() + 60
        while not all(_ignores_sigint(pid) for pid in workers):
            assert time.monotonic() < deadline, "the workers never came to ignore SIGINT"
            time.sleep(0.002)
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        got = pool.results()
    assert [{k: v for k, v in r.items() if k != "pid"} for r in got.values()] == [_square(2), _square(3)]
    assert all(r["pid"] in workers for r in got.values()), "a check fell back to this process: a worker died"
    assert caplog.text == ""
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def _sigint_disposition(_: int) -> dict:
    return {"ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}


def test_only_the_workers_ignore_sigint_and_the_variable_asking_them_is_gone_after():
    before = signal.getsignal(signal.SIGINT)
    got = run_checks(_sigint_disposition, {"a": 0, "b": 1}, workers=2)
    assert got == {"a": {"ignored": True}, "b": {"ignored": True}}
    assert WORKER_IGNORES_SIGINT not in os.environ and signal.getsignal(signal.SIGINT) == before


def test_worker_count_one_per_usable_core_and_compiling_check(monkeypatch):
    monkeypatch.setattr("fuelpipe.oracles.worker_pool.usable_cores", lambda: 2)
    assert worker_count(8, on_cpu=True) == 2
    assert worker_count(1, on_cpu=True) == 0  # one compile (the rest traced, milliseconds): no worker start
    assert worker_count(8, on_cpu=False) == 0
    monkeypatch.setattr("fuelpipe.oracles.worker_pool.usable_cores", lambda: 16)
    assert worker_count(5, on_cpu=True) == 5  # never more workers than compiling checks
    monkeypatch.setattr("fuelpipe.oracles.worker_pool.usable_cores", lambda: 1)
    assert worker_count(8, on_cpu=True) == 0


def test_config_variants_in_workers_equals_in_process_and_counts_builds(compose_cfg, monkeypatch, caplog):
    cfg = compose_cfg(["model=llama_tiny", "backend=fx", "experiment.new_tokens=4"])
    asm = assemble(cfg)
    here = run_one(cfg, asm, ORACLES["config_variants"])
    monkeypatch.setattr(config_variants, "worker_count", lambda compiling_jobs, on_cpu: 2)
    before = build_tally.current()
    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        pooled = run_one(cfg, asm, ORACLES["config_variants"])
    assert caplog.text == ""  # answered by the workers, not by a fallback here
    assert pooled.passed and here.passed, (pooled.detail, here.detail)
    assert pooled.metric == here.metric and pooled.detail == here.detail
    assert pooled.builds == here.builds > 0  # the workers' builds are counted here
    assert build_tally.current().since(before).builds == pooled.builds


def _cached_build(folder: str) -> dict:
    from fuelpipe.plan import cache_ledger

    cache_ledger.record(folder, {"status": "miss", "detail": "", "key": "k", "compile_s": 1.0, "load_s": 0.0})
    return {"ok": True}


def test_a_workers_plan_cache_events_reach_the_jobs_summary(tmp_path):
    from fuelpipe.plan import cache_ledger

    start = cache_ledger.mark()
    run_checks(_cached_build, {"a": str(tmp_path), "b": str(tmp_path)}, workers=2)
    summary = cache_ledger.summary_since(start, tmp_path)
    assert summary["builds"] == 2 and summary["statuses"] == {"miss": 2}


def _unknown_in_a_worker(n: int) -> dict:
    import multiprocessing

    from fuelpipe.errors import ConfigError

    if multiprocessing.parent_process() is not None:  # as a family registered only in the parent would be
        raise ConfigError("unknown family 'mine'")
    return {"n": n}


def test_a_name_only_this_process_knows_falls_back_to_this_process(caplog):
    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        got = run_checks(_unknown_in_a_worker, {"a": 1, "b": 2}, workers=2)
    assert got == {"a": {"n": 1}, "b": {"n": 2}}
    assert "ConfigError" in caplog.text


def _type_error_in_a_worker(n: int) -> dict:
    raise TypeError(f"a bug in the check ({n})")


def test_a_checks_own_error_in_a_worker_is_raised_not_retried_here(caplog):
    with caplog.at_level(logging.WARNING, logger="fuelpipe.oracles.worker_pool"):
        with pytest.raises(TypeError, match="a bug in the check"):
            run_checks(_type_error_in_a_worker, {"a": 1, "b": 2}, workers=2)
    assert "in this process" not in caplog.text
