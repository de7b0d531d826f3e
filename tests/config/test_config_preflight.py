"""preflight(): a command line is checked before Hydra runs anything."""
from __future__ import annotations

from conftest import ROOT
from fuelpipe.config.preflight import preflight

STUDY = ROOT / "experiments" / "plan_reuse_cpu"


def test_a_clean_command_line_resolves_its_output_dir():
    pre = preflight(["experiment=smoke", "backend=eager"])
    assert pre.problems == [] and not pre.multirun
    assert pre.output_dir.startswith("outputs/smoke/")
    sweep = preflight(["backend=eager,fx"], multirun=True)
    assert sweep.problems == [] and sweep.output_dir.startswith("multirun/default/")


def test_every_value_of_a_sweep_axis_is_checked():
    pre = preflight(["backend=eager,fxx", "plan=replan,plan_onse"], multirun=True)
    assert pre.problems == [
        "unknown option for config group 'backend' 'fxx'; did you mean 'fx'? available: aot, eager, fx, inductor",
        "unknown option for config group 'plan' 'plan_onse'; did you mean 'plan_once'? "
        "available: captured, plan_once, replan",
    ]


def test_keys_are_checked_against_the_schema_even_when_added():
    pre = preflight(["+kv.block_sise=4", "experiment.oracles.vs_reference.tolerence.float32=1"])
    assert pre.problems == [
        "unknown key in kv 'block_sise'; did you mean 'block_size'? available: block_size, layout, max_seq_len, "
        "num_blocks",
        "unknown key in experiment.oracles.vs_reference 'tolerence'; did you mean 'tolerance'? "
        "available: enabled, inject_fault, tolerance",
    ]


def test_a_bad_value_type_is_a_problem():
    pre = preflight(["experiment.new_tokens=many"])
    assert len(pre.problems) == 1 and "experiment.new_tokens" in pre.problems[0] and "many" in pre.problems[0]


def test_the_shipped_study_composes_as_a_sweep():
    pre = preflight([], config_name="study", config_dir=str(STUDY), multirun=True)
    assert pre.problems == [] and pre.output_dir.startswith("multirun/plan_reuse_cpu/")


def test_sweep_axes_written_in_a_config_are_checked(tmp_path):
    (tmp_path / "study.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n      backend: eager,fx\n"
        "      kv: contiguous,pagd\n"
    )
    pre = preflight([], config_name="study", config_dir=str(tmp_path), multirun=True)
    assert pre.problems == [
        "unknown option for config group 'kv' 'pagd'; did you mean 'paged'? available: contiguous, latent, paged, ring"
    ]
    # a command-line axis replaces the config's axis of the same key
    assert preflight(["kv=contiguous"], config_name="study", config_dir=str(tmp_path), multirun=True).problems == []


def test_conf_dir_follows_the_environment_and_names_a_missing_tree(monkeypatch, tmp_path):
    import shutil

    import pytest

    from fuelpipe.config.paths import ENV_VAR, conf_dir
    from fuelpipe.errors import ConfigError

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=rf"nowhere/config.yaml does not exist .*set {ENV_VAR}"):
        conf_dir()
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "conf"))
    assert conf_dir() == (tmp_path / "conf").resolve()
    assert preflight(["backend=eager"]).problems == []
