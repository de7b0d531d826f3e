"""Where the config tree lives.

``conf/`` sits at the repository root, beside the ``fuelpipe`` package, so a
source checkout or an editable install (``pip install -e .``) finds it with
no copying. ``FUELPIPE_CONF_DIR`` points elsewhere (e.g. a copy of ``conf/``
next to a non-editable install).
"""
from __future__ import annotations

import os
from pathlib import Path

from fuelpipe.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "FUELPIPE_CONF_DIR"


def conf_dir() -> Path:
    path = Path(os.environ.get(ENV_VAR) or REPO_ROOT / "conf").resolve()
    if not (path / "config.yaml").is_file():
        raise ConfigError(
            f"config tree not found: {path}/config.yaml does not exist "
            f"(install fuelpipe editable from a checkout, or set {ENV_VAR} to a conf/ directory)"
        )
    return path
