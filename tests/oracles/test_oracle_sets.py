"""The oracle set is a config group (conf/oracles/): ``gate`` runs every oracle that is on by default,
``none`` only those an override enables by name. Presets pick a set instead of listing oracles, and the
set is one switch (experiment.oracles_by_default), so an oracle registered later follows it too."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import CONF
from fuelpipe.config import register_configs
from fuelpipe.config.validate import validate
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.registry import ORACLES, OracleSpec, Tolerance
from fuelpipe.runner.oracles import enabled_oracles

QUIET_PRESETS = ("bench", "bench_batch", "bench_context", "bench_peers", "generate")  # timing or text: no oracles


def _registered() -> list[str]:
    return list(ORACLES.entries())  # in registration order, as the schema lists them


def _on_by_default() -> list[str]:
    return [name for name, spec in ORACLES.entries().items() if spec.enabled_by_default]


def test_the_default_set_is_the_gate_and_runs_every_oracle(compose_cfg):
    cfg = compose_cfg([], hydra=True)
    assert cfg.hydra.runtime.choices["oracles"] == "gate"
    assert enabled_oracles(cfg.experiment) == _on_by_default() == _registered()  # the built-ins are all on


@pytest.mark.parametrize("preset", QUIET_PRESETS)
def test_a_quiet_preset_picks_none_instead_of_listing_oracles(compose_cfg, preset):
    written = OmegaConf.load(CONF / "experiment" / f"{preset}.yaml")
    assert {"override /oracles": "none"} in written.defaults
    assert "oracles" not in written.experiment
    cfg = compose_cfg([f"experiment={preset}"], hydra=True)
    assert cfg.hydra.runtime.choices["oracles"] == "none"
    assert enabled_oracles(cfg.experiment) == []
    assert not any(oc.enabled for oc in cfg.experiment.oracles.values())  # what results.json's config records


def test_an_override_turns_one_oracle_back_on_and_validates(compose_cfg):
    cfg = compose_cfg(["experiment=bench", "experiment.oracles.vs_reference.enabled=true"])
    assert enabled_oracles(cfg.experiment) == ["vs_reference"]
    assert validate(cfg) == []
    resolved = OmegaConf.to_container(cfg, resolve=True)["experiment"]["oracles"]
    assert [name for name, oc in resolved.items() if oc["enabled"]] == ["vs_reference"]


def test_the_command_line_set_wins_over_the_presets(compose_cfg):
    on = compose_cfg(["experiment=bench", "oracles=gate"])
    assert enabled_oracles(on.experiment) == _registered()
    off = compose_cfg(["experiment=smoke", "oracles=none", "experiment.oracles.kv_sharing.enabled=true"])
    assert enabled_oracles(off.experiment) == ["kv_sharing"]


def test_the_gate_still_turns_one_off_by_name(compose_cfg):
    cfg = compose_cfg(["experiment.oracles.kv_sharing.enabled=false"])
    assert enabled_oracles(cfg.experiment) == [n for n in _registered() if n != "kv_sharing"]


def test_an_oracle_registered_later_follows_the_set(compose_cfg):
    def run(inp):
        raise AssertionError("only the selection is under test")

    gate, none = compose_cfg([]).experiment, compose_cfg(["oracles=none"]).experiment  # composed before it exists
    ORACLES.register(OracleSpec("later", run, Tolerance.BIT_EXACT, Fault.STALE_OFFSET, enabled_by_default=True))
    try:
        # absent from those configs: the runner honours the set's switch
        assert enabled_oracles(gate)[-1] == "later" and enabled_oracles(none) == []
        # once the schema knows it: an entry that follows the set, with no YAML edited
        register_configs()
        assert "later" in enabled_oracles(compose_cfg([]).experiment)
        assert "later" not in enabled_oracles(compose_cfg(["experiment=bench"]).experiment)
        assert enabled_oracles(compose_cfg(["oracles=none", "experiment.oracles.later.enabled=true"]).experiment) \
            == ["later"]
    finally:
        ORACLES.unregister("later")
        register_configs()


def test_an_oracle_off_by_default_stays_off_in_the_gate(compose_cfg):
    def run(inp):
        raise AssertionError("only the selection is under test")

    ORACLES.register(OracleSpec("opt_in", run, Tolerance.BIT_EXACT, Fault.STALE_OFFSET, enabled_by_default=False))
    try:
        register_configs()
        assert "opt_in" not in enabled_oracles(compose_cfg([]).experiment)
        assert "opt_in" in enabled_oracles(compose_cfg(["experiment.oracles.opt_in.enabled=true"]).experiment)
    finally:
        ORACLES.unregister("opt_in")
        register_configs()
