"""A Hydra launcher that runs each job of a sweep as a Ray task.

``hydra/launcher=ray_cluster`` selects it (conf/hydra/launcher/ray_cluster.yaml).
fuelpipe ships its own instead of using ``hydra-ray-launcher`` because that
package pins ``cloudpickle<3``, which conflicts with the joblib launcher's
joblib>=1.6, and it pulls in boto3 for its AWS autoscaler mode. What a sweep
needs is small: ``ray.init``, one ``ray.remote`` task per job, ``run_job``.

``address: null`` starts a local Ray instance (``ray.init(address="local")``,
never an already running one) and shuts it down when the sweep ends;
``"auto"`` or ``host:port`` joins a running cluster and leaves it running.
Every job runs in the working directory of the command that started the sweep
when that directory exists on the worker (a joined cluster's workers start
where ``ray start`` ran), so relative paths on the command line mean the same
in every job. On a multi-node cluster fuelpipe must be installed on every
node, and the sweep directory must be on a filesystem the nodes share.

Ray is imported only when a sweep launches: Hydra imports every plugin module
when it scans for plugins, and most runs never use this one.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from fuelpipe.runner.launched_job import execute_job, first_line, lost_job_return, open_sweep

log = logging.getLogger(__name__)

LOG_GRACE_S = 1.0


class FuelpipeRayLauncher(Launcher):
    def __init__(
        self, address: Optional[str] = None, num_cpus: float = 1, num_gpus: float = 0, init: Any = None
    ) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.init = OmegaConf.to_container(init, resolve=True) if OmegaConf.is_config(init) else dict(init or {})
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray

        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        sweep_dir = open_sweep(self.config)

        local = self.address is None
        ray.init(address="local" if local else self.address, **self.init)
        try:
            where = ray.get_runtime_context().gcs_address
            log.info(f"Ray: {'started a local instance' if local else 'joined the cluster'} at {where}")
            log.info(f"Ray is launching {len(job_overrides)} jobs (num_cpus={self.num_cpus}, "
                     f"num_gpus={self.num_gpus} each), sweep output dir : {sweep_dir}")
            for idx, overrides in enumerate(job_overrides):
                log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")

            remote = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(execute_job)
            # Put once what every job shares, rather than once per job.
            shared = [ray.put(x) for x in (self.hydra_context, self.config, self.task_function, Singleton.get_state())]
            refs = [
                remote.remote(initial_job_idx + idx, list(overrides), os.getcwd(), *shared)
                for idx, overrides in enumerate(job_overrides)
            ]
            # In job order, each awaited on its own: a job whose worker died is that job's status, and
            # every other job still runs to its end (one ray.get of all refs raised at the first loss).
            runs = [self._outcome(ray, ref, initial_job_idx + idx, overrides)
                    for idx, (ref, overrides) in enumerate(zip(refs, job_overrides))]
            # Ray forwards the workers' output to this terminal asynchronously (its log monitor
            # polls the workers' log files): a moment before disconnecting, or the last lines are lost.
            time.sleep(LOG_GRACE_S)
        finally:
            ray.shutdown()  # stops a local instance; from a joined cluster it only disconnects
            if local:
                log.info("Ray: local instance shut down")
        assert all(isinstance(run, JobReturn) for run in runs)
        return runs


    def _outcome(self, ray, ref, idx: int, overrides: Sequence[str]) -> JobReturn:
        """The job's own return, or, when its worker died before it reported, a ``crashed`` record of it.

        A crash inside the job is already recorded by the job's watcher (fuelpipe.runner.isolated); what
        reaches here is the loss of the watcher's worker itself (killed, out of memory, its node gone)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as err:
            run = lost_job_return(self.hydra_context, self.config, idx, overrides, first_line(err))
            log.error(f"Ray: job #{idx} ({' '.join(filter_overrides(overrides))}) was lost: "
                      f"{type(err).__name__}; recorded as crashed in {run.working_dir}")
            return run
