"""An oracle's independent checks in worker processes, so their compiles overlap on a multi-core machine.

An ahead-of-time compile spends most of its seconds in one single-threaded C++ compiler process, so checks
that each compile their own program (``config_variants``' four on ``backend=aot``) finish in about half the
wall time on two cores when two run at once. Each worker is a fresh interpreter (``spawn``: no inherited
OpenMP threads or torch state) that runs whole checks and sends back their plain results, the builds
they made and their plan-cache events (recorded here, so the oracle's ``builds`` and the job's plan-cache
summary stay whole). Starting them
earlier, beside the other oracles, was measured: 2 s of 97 on 2 cores, for 20 s more CPU (the cores are
busy either way), and was not kept.

Results come back in the jobs' order whatever order they finish in, and are the values the check gives
in-process (the check is a pure function of its picklable job). If the pool cannot run (a job that does
not pickle, a worker that dies, a name registered in this process only), every check not yet answered
runs here instead, and the log says why: a broken pool costs time, never a check. Workers ignore Ctrl-C;
this process stops them at once when it is interrupted.
"""
from __future__ import annotations

import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import logging
import multiprocessing as mp
import os
import pickle
import signal
from typing import Callable, Generic, Mapping, Optional, TypeVar

from fuelpipe.errors import ConfigError
from fuelpipe.plan import build_tally, cache_ledger

J = TypeVar("J")
log = logging.getLogger(__name__)
# A worker that cannot start or answer; ConfigError: a name registered in this process only (a family,
# backend or pass an extension added with ``register``), which a fresh interpreter does not know.
POOL_FAILURES = (BrokenProcessPool, pickle.PicklingError, AttributeError, TypeError, OSError, ConfigError)


def worker_count(compiles: bool, on_cpu: bool, jobs: int) -> int:
    """Workers for ``jobs`` checks: one per core when each check compiles a program on CPU, else none
    (0: run in-process; a traced or eager check is milliseconds, less than a worker's start)."""
    cores = os.cpu_count() or 1
    if not compiles or not on_cpu or jobs < 2 or cores < 2:
        return 0
    return min(jobs, cores)


def _quiet_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us


def _run_counted(check: Callable[[J], dict], job: J) -> tuple[dict, build_tally.Tally, list]:
    """In a worker: the check's result, the builds it made and its plan-cache events, for the parent."""
    before, mark = build_tally.current(), cache_ledger.mark()
    result = check(job)
    return result, build_tally.current().since(before), cache_ledger.events_since(mark)


class CheckPool(Generic[J]):
    """``check(job)`` for every job: submitted to ``workers`` processes now (0: none, run at ``results``)."""

    def __init__(self, check: Callable[[J], dict], jobs: Mapping[str, J], workers: int) -> None:
        self._check, self._jobs = check, dict(jobs)
        self._pool: Optional[cf.ProcessPoolExecutor] = None
        self._futures: dict[cf.Future, str] = {}
        if workers >= 2:
            try:
                for job in self._jobs.values():  # here, not in the pool's feeder thread, where it would be lost
                    pickle.dumps((check, job))
                self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                                    initializer=_quiet_worker)
                self._futures = {self._pool.submit(_run_counted, check, job): name for name, job in self._jobs.items()}
            except POOL_FAILURES as err:
                self._fallback(err)

    def results(self) -> dict[str, dict]:
        """name -> the check's result, in the jobs' order; waits for the workers (a check's own exception
        is raised here, as it would be in-process)."""
        done: dict[str, dict] = {}
        try:
            if self._pool is not None:
                try:
                    for future in cf.as_completed(self._futures):
                        result, spent, events = future.result()
                        done[self._futures[future]] = result
                        build_tally.add(spent)
                        for folder, event in events:
                            cache_ledger.record(folder, event)
                except POOL_FAILURES as err:
                    self._fallback(err, len(self._jobs) - len(done))
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
        """Stop the workers now (nothing more will be collected)."""
        if self._pool is None:
            return
        for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
            proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def _fallback(self, err: BaseException, left: Optional[int] = None) -> None:
        log.warning("oracle workers could not run (%s: %s); running %d check(s) in this process",
                    type(err).__name__, err, len(self._jobs) if left is None else left)
        self.cancel()


def run_checks(check: Callable[[J], dict], jobs: Mapping[str, J], workers: int) -> dict[str, dict]:
    """name -> ``check(job)`` for every job, on ``workers`` processes (0: here, one after another)."""
    return CheckPool(check, jobs, workers).results()
