"""plan.mode, plan.offset_mode, plan.cache_policy, weights.dtype and weights.activations are defined once
(fuelpipe.modes): the schema types its fields
with those enums and the runtime accepts exactly their values, so the two cannot drift apart."""
from __future__ import annotations

import typing

import pytest

from fuelpipe.backbone import OFFSET_MODES
from fuelpipe.config.schema import PlanConfig, WeightsConfig
from fuelpipe.errors import ConfigError
from fuelpipe.modes import RUNNABLE_PLAN_MODES, ActivationForm, CachePolicy, OffsetMode, PlanMode, QuantKind, values
from fuelpipe.quant import formats
from fuelpipe.plan.backends import CACHE_POLICIES, BackendSpec


def test_schema_types_the_plan_fields_with_the_shared_enums():
    hints = typing.get_type_hints(PlanConfig)
    assert hints["cache_policy"] is CachePolicy
    assert hints["offset_mode"] == typing.Optional[OffsetMode]
    assert hints["mode"] is PlanMode
    weights = typing.get_type_hints(WeightsConfig)
    assert weights["dtype"] == typing.Optional[QuantKind] and weights["activations"] is ActivationForm
    assert formats.QuantKind is QuantKind and formats.ActivationForm is ActivationForm  # one class, not a twin


def test_the_driver_runs_replan_and_plan_once_and_refuses_captured_typed():
    assert [PlanMode.parse(m.value) for m in RUNNABLE_PLAN_MODES] == [PlanMode.replan, PlanMode.plan_once]
    with pytest.raises(ConfigError, match=r"plan mode must be one of \['replan', 'plan_once'\].*got 'captured'"):
        PlanMode.parse("captured")
    with pytest.raises(ConfigError, match="got 'plan-once'"):
        PlanMode.parse("plan-once")


def test_runtime_tuples_are_the_enums_values():
    assert OFFSET_MODES == values(OffsetMode) == ("tensor", "symbol")
    assert CACHE_POLICIES == values(CachePolicy) == ("cold", "warm")


@pytest.mark.parametrize("policy", values(CachePolicy))
def test_every_composable_cache_policy_is_accepted_at_run_time(compose_cfg, policy):
    cfg = compose_cfg([f"plan.cache_policy={policy}"])
    assert BackendSpec(name="fx", cache_policy=cfg.plan.cache_policy.value).cache_policy == policy


def test_a_value_outside_the_enum_is_refused_naming_the_choices(compose_cfg):
    with pytest.raises(ConfigError, match=r"\['cold', 'warm'\], got 'tepid'"):
        BackendSpec(name="fx", cache_policy="tepid")
    with pytest.raises(Exception, match="tepid"):
        compose_cfg(["plan.cache_policy=tepid"])
