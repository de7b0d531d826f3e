"""``hydra/launcher=submitit_localhost`` and ``slurm``: Hydra's submitit launchers, where a lost job process
is that job's status.

A job's own crash is recorded by its watcher (fuelpipe.runner.isolated), which runs inside submitit's
process for the job. When that process is itself lost (killed, out of memory, a node gone, SLURM's
time limit), submitit's ``job.results()`` raises, and Hydra's plugin, which awaits the jobs in one list
comprehension, ended the sweep there: later jobs' results never collected, the CLI gone while they
still ran. Here each job is awaited on its own, and a job whose results cannot be had is recorded
``crashed`` (its worker died, with submitit's message) where its results.json would have been; every
other job is awaited to its end.

The plugin is the ``[submitit]`` extra; without it these classes are not defined (Hydra scans every
module under ``hydra_plugins`` whether a sweep uses it or not).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Sequence

from hydra.core.utils import JobReturn, filter_overrides

from fuelpipe.runner.launched_job import first_line, lost_job_return

log = logging.getLogger(__name__)

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
except ImportError:  # the [submitit] extra is not installed
    LocalLauncher = SlurmLauncher = None

_OURS = ("FuelpipeSubmititLocalLauncher", "FuelpipeSubmititSlurmLauncher")


def __getattr__(name: str) -> Any:
    """Without the plugin these launchers do not exist: say what to install when a config names one."""
    if name in _OURS:
        raise ImportError(f"{name} needs Hydra's submitit launcher, which is not installed: "
                          "pip install -e \".[submitit]\" (or pip install hydra-submitit-launcher)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _AwaitedAlone:
    """A submitted job whose ``results()`` records the job lost instead of raising."""

    def __init__(self, job: Any, launcher: Any, idx: int, overrides: list[str]) -> None:
        self.job, self.launcher, self.idx, self.overrides = job, launcher, idx, overrides

    def results(self) -> list[JobReturn]:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return self.job.results()
        except (UncompletedJobError, FailedJobError) as err:
            run = lost_job_return(self.launcher.hydra_context, self.launcher.config, self.idx, self.overrides,
                                  first_line(err))
            log.error(f"submitit: job #{self.idx} ({' '.join(filter_overrides(self.overrides))}) was lost "
                      f"(submitit job {self.job.job_id}); recorded as crashed in {run.working_dir}")
            return [run]


@contextlib.contextmanager
def _each_job_awaited_alone(launcher: Any) -> Iterator[None]:
    """While the plugin launches: its executor hands back jobs that record their own loss."""
    import submitit

    plugin_executor = submitit.AutoExecutor

    class Executor(plugin_executor):  # type: ignore[misc,valid-type]
        def map_array(self, fn: Any, *iterables: Sequence[Any]) -> list[Any]:
            jobs = super().map_array(fn, *iterables)
            overrides, _key, idxs = iterables[0], iterables[1], iterables[2]
            return [_AwaitedAlone(j, launcher, i, list(o)) for j, o, i in zip(jobs, overrides, idxs)]

    submitit.AutoExecutor = Executor
    try:
        yield
    finally:
        submitit.AutoExecutor = plugin_executor


if LocalLauncher is not None:

    class FuelpipeSubmititLocalLauncher(LocalLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            with _each_job_awaited_alone(self):
                return super().launch(job_overrides, initial_job_idx)

    class FuelpipeSubmititSlurmLauncher(SlurmLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            with _each_job_awaited_alone(self):
                return super().launch(job_overrides, initial_job_idx)
