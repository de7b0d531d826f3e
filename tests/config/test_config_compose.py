"""Every YAML file under conf/ composes, and what it says is what the composed config holds."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import CONF

YAML_FILES = sorted(p.relative_to(CONF) for p in CONF.rglob("*.yaml"))


def _flatten(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def _override_and_package(rel: Path) -> tuple[list[str], str]:
    """The override selecting ``rel`` and the node its keys land in: its ``# @package`` header, else its group."""
    group = rel.parent.as_posix()
    first = (CONF / rel).read_text().lstrip().splitlines()[0]
    package = first.removeprefix("# @package").strip() if first.startswith("# @package") else group.replace("/", ".")
    return [f"{group}={rel.stem}"], "" if package == "_global_" else package


def test_the_tree_has_every_group():
    groups = {p.parts[0] for p in YAML_FILES if len(p.parts) > 1}
    assert groups == {"model", "kv", "backend", "plan", "oracles", "experiment", "hydra"}
    assert len(YAML_FILES) > 20  # the glob really recursed (hydra/launcher/ is two levels down)
    assert Path("hydra/launcher/joblib_local.yaml") in YAML_FILES


def test_root_config_selects_one_option_per_group(compose_cfg):
    cfg = compose_cfg(hydra=True, tiny=False)
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))["defaults"]
    chosen = {k: v for entry in defaults if isinstance(entry, dict) for k, v in entry.items()}
    assert list(chosen) == ["model", "kv", "backend", "plan", "oracles", "experiment", "hydra"]
    assert defaults[0] == "fuelpipe_schema" and defaults[-1] == "_self_"
    for group, option in chosen.items():
        assert cfg.hydra.runtime.choices[group] == option


@pytest.mark.parametrize("rel", [p for p in YAML_FILES if p != Path("config.yaml")], ids=str)
def test_every_yaml_composes_and_is_applied(rel, compose_cfg):
    overrides, package = _override_and_package(rel)
    cfg = compose_cfg(overrides, hydra=True)
    node = OmegaConf.select(cfg, package) if package else cfg
    composed = OmegaConf.to_container(node, resolve=False, enum_to_str=True)
    written = OmegaConf.to_container(OmegaConf.load(CONF / rel), resolve=False)
    written.pop("defaults", None)
    leaves = list(_flatten(written))
    assert leaves, f"{rel} sets nothing"
    for key, value in leaves:
        got = composed
        for part in key.split("."):
            got = got[part]
        assert got == value, f"{rel}: {key} composed to {got!r}, the file says {value!r}"


@pytest.mark.parametrize("rel", [p for p in YAML_FILES if p.parts[0] == "model"], ids=str)
def test_model_options_are_named_family_size(rel):
    written = OmegaConf.load(CONF / rel)
    assert rel.stem == f"{written.family}_{written.size}" or rel.stem == written.size


def test_experiment_presets_are_global_packages():
    for rel in YAML_FILES:
        if rel.parts[0] == "experiment":
            assert (CONF / rel).read_text().startswith("# @package _global_"), rel


def test_joblib_launcher_config_runs_two_workers(compose_cfg):
    cfg = compose_cfg(["hydra/launcher=joblib_local"], hydra=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == 2
    assert cfg.hydra.job.chdir is False


def test_unknown_key_or_enum_value_fails_at_compose(compose_cfg):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="famly"):
        compose_cfg(["model.famly=llama"])
    with pytest.raises(ConfigCompositionException, match="flaot32"):
        compose_cfg(["model.dtype=flaot32"])


def test_an_added_unknown_key_is_a_validation_reason(compose_cfg):
    """Hydra's `+key=value` writes even into a structured node; validate() names the stray key."""
    from fuelpipe.config.validate import validate

    reasons = validate(compose_cfg(["+model.famly=llama"]))
    assert reasons == [
        "unknown key in model 'famly'; did you mean 'family'? "
        "available: dtype, family, overrides, path, seed, size, weights"
    ]
