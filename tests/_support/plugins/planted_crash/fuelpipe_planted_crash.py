"""Test-only: an experiment stage that kills its own process with a signal, as a native crash would.

Not part of fuelpipe. Tests put this folder on PYTHONPATH; its ``.dist-info`` registers the stage
through the ``fuelpipe.stages`` entry-point group, exactly as an installed package would, so every
process of a sweep (the CLI, launcher workers, each job) sees it. ``experiment.planted_crash.signal``
names the signal (``none``: the stage does nothing), ``target`` whom it kills; it fires after the job's
generation, in its checks.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from fuelpipe.stages import StageSpec


@dataclass
class PlantedCrash:
    enabled: bool = True
    signal: str = "none"  # none | SIGSEGV | SIGKILL | SIGABRT ...
    target: str = "job"  # job: the job's own process; watcher: the process that started it (a lost worker)


def _run(section, cfg, asm, output_dirs) -> dict:
    if section.signal != "none":
        os.kill(os.getpid() if section.target == "job" else os.getppid(), getattr(signal, section.signal))
    return {"signal": section.signal}


STAGE = StageSpec("planted_crash", PlantedCrash, _run)
