"""fuelpipe's launcher plugins import without their optional packages, and name what to install when used."""
from __future__ import annotations

import importlib
import sys

import pytest


def test_the_submitit_launchers_without_the_plugin_say_what_to_install(monkeypatch):
    name = "hydra_plugins.fuelpipe_submitit_launcher.submitit_launcher"
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher.submitit_launcher", None)
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)  # Hydra imports every plugin module, used or not
    try:
        for cls in ("FuelpipeSubmititLocalLauncher", "FuelpipeSubmititSlurmLauncher"):
            with pytest.raises(ImportError, match=r'pip install -e "\.\[submitit\]"'):
                getattr(module, cls)
        with pytest.raises(AttributeError):
            module.something_else
    finally:
        sys.modules.pop(name, None)  # the next import sees the installed plugin again


def test_the_shipped_launcher_configs_name_fuelpipes_launchers():
    from conftest import ROOT

    targets = {p.stem: next(line.split(":", 1)[1].strip() for line in p.read_text().splitlines()
                            if line.startswith("_target_:"))
               for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")}
    assert targets["joblib_local"].endswith("fuelpipe_joblib_launcher.joblib_launcher.FuelpipeJoblibLauncher")
    assert targets["submitit_localhost"].endswith(".FuelpipeSubmititLocalLauncher")
    assert targets["slurm"].endswith(".FuelpipeSubmititSlurmLauncher")
    assert targets["ray_cluster"].endswith(".FuelpipeRayLauncher")
