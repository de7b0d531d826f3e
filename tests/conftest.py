"""Shared helpers: compose the real config tree in-process, and run the real CLI in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fuelpipe.config import conf_dir
from fuelpipe.config.preflight import VERSION_BASE

ROOT = Path(__file__).resolve().parents[1]
CONF = conf_dir()
FAST = ["backend=eager"]  # presets say nothing about the backend; eager keeps in-process runs quick


@pytest.fixture
def compose_cfg():
    """compose_cfg(overrides, hydra=False) -> DictConfig, with GlobalHydra cleared around every call."""

    def _compose(overrides=(), hydra: bool = False):
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONF), version_base=VERSION_BASE):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra)

    yield _compose
    GlobalHydra.instance().clear()


def run_cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m fuelpipe ARGS`` as CI runs it (CI=true: no progress bars)."""
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "fuelpipe", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
