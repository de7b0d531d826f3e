"""An oracle's independent checks in worker processes, so their compiles overlap on a multi-core machine.

An ahead-of-time compile spends most of its seconds in one single-threaded C++ compiler process, so checks
that each compile their own program (``config_variants`` on ``backend=aot``) finish in about half the wall
time on two cores when two run at once. Each worker is a fresh interpreter (``spawn``: no inherited OpenMP
threads or torch state) that runs whole checks and sends back their plain results, the builds they made and
their plan-cache events (recorded here, so the oracle's ``builds`` and the job's plan-cache summary stay
whole). Starting them earlier, beside the other oracles, was measured: 2 s of 97 on 2 cores, for 20 s more
CPU (the cores are busy either way), and was not kept.

Results come back in the jobs' order whatever order they finish in, and are the values the check gives
in-process (the check is a pure function of its picklable job); a check that raises in a worker raises
here. A pool that cannot run (a job that does not pickle, a worker that dies) and a check that meets a name
registered in this process only (``ConfigError`` in the worker: an extension's ``register``) run here
instead, and the log says why: a broken pool costs time, never a check.

Each worker leads its own process group, dies with this process (Linux), and is stopped with everything it
started (its C++ compilers) when this process is interrupted: a terminal's Ctrl-C reaches only this
process, which then kills the groups. A worker is born in this process's group, where a Ctrl-C reaches it
until its start-up imports (seconds on a loaded machine) have run the initializer: it ignores SIGINT from
its first ``import fuelpipe`` on (``workers_ignore_sigint``), so no ``KeyboardInterrupt`` traceback of its
start-up reaches the terminal.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import pickle
import signal
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Generic, Mapping, Optional, TypeVar

from fuelpipe.child_process import die_with_parent, workers_ignore_sigint
from fuelpipe.errors import ConfigError
from fuelpipe.plan import build_tally, cache_ledger
from fuelpipe.threads import usable_cores

J = TypeVar("J")
log = logging.getLogger(__name__)
NOT_PICKLABLE = (pickle.PicklingError, AttributeError, TypeError)  # what pickle.dumps raises for a job


def worker_count(compiling_jobs: int, on_cpu: bool) -> int:
    """Workers for an oracle with ``compiling_jobs`` checks that each compile a program: one per usable core,
    at most one per such check; 0 (run in-process) on one core, off CPU, or with fewer than two (a traced
    check is milliseconds, less than a worker's start)."""
    cores = usable_cores()
    if not on_cpu or compiling_jobs < 2 or cores < 2:
        return 0
    return min(compiling_jobs, cores)


def _start_worker() -> None:
    os.setpgrp()  # its own group: a terminal's Ctrl-C is the parent's; the parent kills the group
    die_with_parent()
    os.environ["FUELPIPE_QUIET"] = "1"  # no progress lines of its own on the parent's terminal


def _run_counted(check: Callable[[J], dict], job: J) -> tuple[str, object, build_tally.Tally, list]:
    """In a worker: ("ok", result) or ("elsewhere", reason) for a name only the parent knows, with the
    builds the check made and its plan-cache events, for the parent. Another exception propagates."""
    before, mark = build_tally.current(), cache_ledger.mark()
    try:
        outcome = ("ok", check(job))
    except ConfigError as err:
        outcome = ("elsewhere", f"ConfigError: {err}")
    return (*outcome, build_tally.current().since(before), cache_ledger.events_since(mark))


class CheckPool(Generic[J]):
    """``check(job)`` for every job: submitted to ``workers`` processes now (0: none, run at ``results``)."""

    def __init__(self, check: Callable[[J], dict], jobs: Mapping[str, J], workers: int) -> None:
        self._check, self._jobs = check, dict(jobs)
        self._pool: Optional[cf.ProcessPoolExecutor] = None
        self._futures: dict[cf.Future, str] = {}
        if workers < 2:
            return
        try:
            for job in self._jobs.values():  # here, not in the pool's feeder thread, where it would be lost
                pickle.dumps((check, job))
        except NOT_PICKLABLE as err:
            log.warning("oracle workers not started (%s: %s); running %d check(s) in this process",
                        type(err).__name__, err, len(self._jobs))
            return
        try:
            self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                                initializer=_start_worker)
            with workers_ignore_sigint():  # submit starts the workers (spawn)
                self._futures = {self._pool.submit(_run_counted, check, job): name
                                 for name, job in self._jobs.items()}
        except BaseException:  # Ctrl-C while the workers start: none is left behind
            self.cancel()
            raise

    def results(self) -> dict[str, dict]:
        """name -> the check's result, in the jobs' order; waits for the workers (a check's own exception
        is raised here, as it would be in-process)."""
        done: dict[str, dict] = {}
        try:
            if self._pool is not None:
                try:
                    for future in cf.as_completed(self._futures):
                        status, value, spent, events = future.result()
                        build_tally.add(spent)
                        for folder, event in events:
                            cache_ledger.record(folder, event)
                        if status == "ok":
                            done[self._futures[future]] = value
                        else:
                            log.warning("oracle check %s runs in this process: its worker could not (%s)",
                                        self._futures[future], value)
                except BrokenProcessPool as err:
                    log.warning("oracle workers died (%s); running %d check(s) in this process", err,
                                len(self._jobs) - len(done))
                    self.cancel()
            for name, job in self._jobs.items():
                if name not in done:
                    done[name] = self._check(job)
        except BaseException:
            self.cancel()
            raise
        if self._pool is not None:  # every answer is in: let the workers exit on their own
            self._pool.shutdown(wait=True)
            self._pool = None
        return {name: done[name] for name in self._jobs}

    def cancel(self) -> None:
        """Stop the workers and what they started, now (nothing more will be collected)."""
        if self._pool is None:
            return
        for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its group: its compilers go too
            except (ProcessLookupError, PermissionError):
                proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None


def run_checks(check: Callable[[J], dict], jobs: Mapping[str, J], workers: int) -> dict[str, dict]:
    """name -> ``check(job)`` for every job, on ``workers`` processes (0: here, one after another)."""
    return CheckPool(check, jobs, workers).results()
