"""plan.offset_mode and plan.cache_policy are defined once (fuelpipe.modes): the schema types its fields
with those enums and the runtime accepts exactly their values, so the two cannot drift apart."""
from __future__ import annotations

import typing

import pytest

from fuelpipe.backbone import OFFSET_MODES
from fuelpipe.config.schema import PlanConfig
from fuelpipe.errors import ConfigError
from fuelpipe.modes import CachePolicy, OffsetMode, values
from fuelpipe.plan.backends import CACHE_POLICIES, BackendSpec


def test_schema_types_the_plan_fields_with_the_shared_enums():
    hints = typing.get_type_hints(PlanConfig)
    assert hints["cache_policy"] is CachePolicy
    assert hints["offset_mode"] == typing.Optional[OffsetMode]


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
