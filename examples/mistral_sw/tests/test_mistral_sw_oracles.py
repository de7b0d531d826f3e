"""The family gated by fuelpipe's oracles through its pytest plugin (no fuelpipe test code copied).

Every portable oracle on eager and fx, contiguous and paged KV; the combination list could
equally come from a YAML file (``@pytest.mark.fuelpipe_matrix(yaml="matrix.yaml")``).
"""
import pytest

from models.registry import build_random_model


@pytest.mark.fuelpipe_matrix(backends=["eager", "fx"], kv=["contiguous", "paged"])
def test_gate_on_a_model_instance(fuelpipe_oracles, fuelpipe_combo, fuelpipe_oracle):
    model = build_random_model("mistral_sw", "tiny", seed=3)
    fuelpipe_oracles(model=model).check(fuelpipe_oracle, fuelpipe_combo)


@pytest.mark.fuelpipe_matrix(oracles=["plan_vs_replan", "key_sensitivity", "batch_vs_solo"])
def test_gate_on_the_config_name(fuelpipe_oracles, fuelpipe_combo, fuelpipe_oracle):
    fuelpipe_oracles(config="mistral_sw_tiny").check(fuelpipe_oracle, fuelpipe_combo)
