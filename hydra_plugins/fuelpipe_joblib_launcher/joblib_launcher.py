"""``hydra/launcher=joblib_local``: Hydra's joblib launcher, where a lost worker is one job's status.

Each job already runs in a process of its own, watched by a loky worker (fuelpipe.runner.isolated),
so a job's own crash never reaches joblib. What remains is the loss of a worker itself (killed, or
taken by the OOM killer): loky then declares its pool broken and kills every other worker, with the
jobs they watch, and ``Parallel`` raises ``TerminatedWorkerError``. Hydra's plugin lets that end the
sweep. This launcher runs the sweep in rounds instead:

- jobs that returned before the pool broke keep their results;
- jobs that had not started go to the next round, in a fresh pool;
- jobs that had started and not returned (the lost one and those loky killed with it) run again,
  each alone in a pool of its own, so the one whose worker dies again is told from the others. It is
  recorded ``crashed`` (its worker died, with loky's message); the others run to their end. When one
  job alone was running, it is the lost one and is not run again.

A job "started" when its worker wrote its marker in ``<sweep dir>/.fuelpipe_started/``.

Ctrl-C reaches the workers and their jobs too (one process group): each running job records itself
``interrupted``. The launcher gives them ``RECORD_GRACE_S`` to do so before it raises: joblib answers a
``KeyboardInterrupt`` by killing its workers, and a job dies with its worker (seen in CI: the sweep
stopped in 0.06 s with no job's results.json written).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from fuelpipe.runner.launched_job import execute_job, first_line, lost_job_return, open_sweep

log = logging.getLogger(__name__)

STARTED_DIR = ".fuelpipe_started"
RECORD_GRACE_S = 2.0  # a job records "interrupted" in ~0.1 s after SIGINT; a signal sent only to the launcher
                      # reaches no job, which then dies with its worker after this wait
_INT_KEYS = ("pre_dispatch", "batch_size", "max_nbytes")  # given as strings on the command line


class FuelpipeJoblibLauncher(JoblibLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        sweep_dir = open_sweep(self.config)
        markers = sweep_dir / STARTED_DIR
        markers.mkdir(exist_ok=True)
        params = self._parallel_params()
        jobs = {initial_job_idx + i: list(o) for i, o in enumerate(job_overrides)}
        log.info(f"joblib is launching {len(jobs)} jobs with loky "
                 f"({', '.join(f'{k}={v}' for k, v in params.items())}), sweep output dir : {sweep_dir}")
        for idx, overrides in jobs.items():
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")

        runs: dict[int, JobReturn] = {}
        pending = list(jobs)
        with _sigint_noted(sweep_dir) as interrupted:
            while pending:
                broken = self._round(pending, jobs, params, markers, runs)
                if broken is None:
                    break
                if interrupted:  # Ctrl-C reached the workers too: a stop, not a lost worker
                    raise KeyboardInterrupt
                self._recover(broken, pending, jobs, markers, runs, interrupted)
                pending = [i for i in pending if i not in runs and not (markers / str(i)).exists()]
        return [runs[i] for i in jobs]

    def _recover(self, broken: BaseException, pending: list[int], jobs: dict[int, list[str]], markers: Path,
                 runs: dict[int, JobReturn], interrupted: list) -> None:
        """After the pool broke: find the lost job among those that had started, and finish the others."""
        suspects = [i for i in pending if i not in runs and (markers / str(i)).exists()]
        log.warning(f"joblib: a worker was lost ({first_line(broken)}); loky stopped the pool with "
                    f"job(s) {suspects} running")
        if len(suspects) == 1:
            runs[suspects[0]] = self._lost(suspects[0], jobs, broken)
            return
        for idx in suspects:  # each alone: whichever loses its worker again is the lost one
            again = self._alone(idx, jobs, markers, runs)
            if interrupted:
                raise KeyboardInterrupt
            if again is not None:
                runs[idx] = self._lost(idx, jobs, again)

    def _parallel_params(self) -> dict[str, Any]:
        params = {k: v for k, v in dict(self.joblib).items()}
        params["backend"] = "loky"  # threads would share Hydra's global state between jobs
        for key in _INT_KEYS:
            value = params.get(key)
            if isinstance(value, str) and value.isdigit():
                params[key] = int(value)
        return params

    def _round(self, idxs: list[int], jobs: dict[int, list[str]], params: dict[str, Any], markers: Path,
               runs: dict[int, JobReturn]) -> BaseException | None:
        """Run ``idxs`` in one pool, filing each return in ``runs`` as it comes; the pool's breakage, if any."""
        from joblib import Parallel, delayed
        from joblib.externals.loky.process_executor import BrokenProcessPool

        for idx in idxs:
            (markers / str(idx)).unlink(missing_ok=True)
        calls = (delayed(_marked_job)(str(markers / str(idx)), idx, jobs[idx], *self._shared()) for idx in idxs)
        try:
            for idx, run in Parallel(return_as="generator_unordered", **params)(calls):
                runs[idx] = run
        except BrokenProcessPool as err:
            return err
        return None

    def _alone(self, idx: int, jobs: dict[int, list[str]], markers: Path,
               runs: dict[int, JobReturn]) -> BaseException | None:
        """Run job ``idx`` in a one-worker loky pool of its own (``Parallel(n_jobs=1)`` would run it in this
        process); the pool's breakage, if any."""
        from joblib.externals.loky import get_reusable_executor
        from joblib.externals.loky.process_executor import BrokenProcessPool

        executor = get_reusable_executor(max_workers=1, reuse=False)
        try:
            _, runs[idx] = executor.submit(_marked_job, str(markers / str(idx)), idx, jobs[idx],
                                           *self._shared()).result()
        except BrokenProcessPool as err:
            return err
        finally:
            executor.shutdown(wait=True)
        return None

    def _shared(self) -> tuple:
        """What every job of the sweep gets besides its own number and overrides (``execute_job``'s rest)."""
        return os.getcwd(), self.hydra_context, self.config, self.task_function, Singleton.get_state()

    def _lost(self, idx: int, jobs: dict[int, list[str]], err: BaseException) -> JobReturn:
        run = lost_job_return(self.hydra_context, self.config, idx, jobs[idx], first_line(err))
        log.error(f"joblib: job #{idx} ({' '.join(filter_overrides(jobs[idx]))}) lost its worker; "
                  f"recorded as crashed in {run.working_dir}")
        return run


@contextlib.contextmanager
def _sigint_noted(sweep_dir: Path) -> Iterator[list]:
    """A list that gets an entry when SIGINT arrives; the handler in place before then runs, once the jobs
    running under ``sweep_dir`` have recorded themselves (or ``RECORD_GRACE_S`` passed)."""
    noted: list = []
    before = signal.getsignal(signal.SIGINT)

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        if len(noted) == 1:
            _await_running_jobs(sweep_dir, RECORD_GRACE_S)
        if callable(before):
            before(signum, frame)
        else:
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield noted  # signals reach the main thread only
        return
    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, before)


def _await_running_jobs(sweep_dir: Path, grace_s: float) -> None:
    """Wait until every job that started in its own process (its job file written) has its results.json."""
    from fuelpipe.results import RESULTS_FILE
    from fuelpipe.runner.isolated import JOB_FILE

    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if all((job.parent / RESULTS_FILE).is_file() for job in sweep_dir.rglob(JOB_FILE)):
            return
        time.sleep(0.02)


def _marked_job(marker: str, idx: int, overrides: list[str], *shared: Any) -> tuple[int, JobReturn]:
    """In a loky worker: mark job ``idx`` started, then run it."""
    Path(marker).touch()
    return idx, execute_job(idx, overrides, *shared)
