"""What fuelpipe's launcher plugins share: one job run in a launcher's worker, and the record of a lost one.

A job's own crash is recorded by its watcher (``fuelpipe.runner.isolated``). What the launchers add is
the loss of the watcher itself (its worker killed, out of memory, its node gone): the launcher learns
it from an exception instead of a return, and records that job ``crashed`` where its results.json
would have been, so the sweep table shows it beside every other job.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict


def open_sweep(config: DictConfig) -> Path:
    """What every launch starts with: Hydra's globals and logging as the driver configured them, and the
    sweep's folder made; its path."""
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return sweep_dir


def sweep_config_of(hydra_context: HydraContext, config: DictConfig, idx: int, overrides: Sequence[str]) -> DictConfig:
    """Job ``idx``'s config as Hydra composes it for a sweep, installed in ``HydraConfig``."""
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return sweep_config


def job_dir(sweep_config: DictConfig) -> Path:
    """The folder job's results.json lands in."""
    return Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)


def execute_job(idx: int, overrides: list[str], driver_cwd: str, hydra_context: HydraContext,
                config: DictConfig, task_function: TaskFunction, singleton_state: dict) -> JobReturn:
    """One job in a launcher's worker process: Hydra's globals and singletons as the driver had them, then
    ``run_job`` from the driver's working directory (a cluster's workers start elsewhere)."""
    setup_globals()
    Singleton.set_state(singleton_state)
    worker_cwd = os.getcwd()
    if os.path.isdir(driver_cwd):
        os.chdir(driver_cwd)
    try:
        sweep_config = sweep_config_of(hydra_context, config, idx, overrides)
        return run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.chdir(worker_cwd)  # workers are reused for later jobs


def lost_job_return(hydra_context: HydraContext, config: DictConfig, idx: int, overrides: Sequence[str],
                    why: str) -> JobReturn:
    """Record job ``idx`` as ``crashed`` (its worker died before it reported, ``why`` says how the launcher
    learnt it) and return what Hydra expects of a finished job."""
    from fuelpipe.results import CRASHED
    from fuelpipe.runner.isolated import record_lost_job

    sweep_config = sweep_config_of(hydra_context, config, idx, overrides)
    path = record_lost_job(sweep_config, why)
    return JobReturn(overrides=list(overrides), cfg=sweep_config, hydra_cfg=sweep_config,
                     working_dir=str(path.parent), task_name=sweep_config.hydra.job.name,
                     status=JobStatus.COMPLETED, _return_value=CRASHED)


def first_line(err: BaseException) -> str:
    """``Type: first line of the message``: how a lost job's record names the launcher's exception."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
