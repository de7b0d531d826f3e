"""The pytest plugin as a user's test suite sees it (pytester runs each suite in-process)."""
from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

MODEL = """
from models.registry import build_random_model

def model():
    return build_random_model("llama", "tiny", seed=5)
"""


def test_a_yaml_matrix_parametrises_combos_and_oracles(pytester):
    pytester.makefile(".yaml", matrix="backends: [eager, fx]\nkv: [contiguous, paged]\noracles: [plan_vs_replan]\n")
    pytester.makepyfile(MODEL + """
import pytest

@pytest.mark.fuelpipe_matrix(yaml="matrix.yaml")
def test_gate(fuelpipe_oracles, fuelpipe_combo, fuelpipe_oracle):
    fuelpipe_oracles(model=model()).check(fuelpipe_oracle, fuelpipe_combo)
""")
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_gate*eager-contiguous-plan_once-plan_vs_replan* PASSED*",
                                 "*test_gate*fx-paged-plan_once-plan_vs_replan* PASSED*"])


def test_a_failing_oracle_fails_the_test_with_its_account(pytester):
    pytester.makepyfile(MODEL + """
import torch

def test_reference_is_off(fuelpipe_oracles):
    m = model()
    honest = m.reference_logits
    m.reference_logits = lambda ids, *a, **k: honest(ids, *a, **k) + torch.linspace(0, 1e-3, m.dims.vocab_size)
    fuelpipe_oracles(model=m).check("vs_reference")
""")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*OracleFailure: oracle vs_reference FAIL [[]backend=fx, plan=plan_once*",
                                 "*tolerance: 1e-05*", "*metrics: max_abs_error=*", "*detail: *"])


def test_an_oracle_that_checks_nothing_skips_never_passes(pytester):
    pytester.makepyfile(MODEL + """
def test_no_twin(fuelpipe_oracles):
    m = model()
    m.family = "llama_without_twin"  # no transformers twin for this family name
    fuelpipe_oracles(model=m).check("vs_transformers")
""")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*vs_transformers skipped: *no transformers twin*"])


def test_negative_controls_are_caught_through_the_harness(pytester):
    pytester.makepyfile(MODEL + """
import pytest

@pytest.mark.fuelpipe_matrix(oracles=["plan_vs_replan", "request_isolation", "batch_isolation"])
def test_controls(fuelpipe_oracles, fuelpipe_combo, fuelpipe_oracle):
    result = fuelpipe_oracles(model=model()).check_catches(fuelpipe_oracle, fuelpipe_combo)
    assert result.negative_control and not result.passed
""")
    pytester.runpytest().assert_outcomes(passed=3)


@pytest.mark.parametrize("marker, message", [
    ('backends=["inductr"]', "unknown backend 'inductr'; did you mean 'inductor'?"),
    ('kv=["pagd"]', "unknown KV strategy 'pagd'; did you mean 'paged'?"),
    ('oracles=["plan_vs_replann"]', "unknown oracle 'plan_vs_replann'; did you mean 'plan_vs_replan'?"),
    ('kv="paged"', "kv must be a non-empty list, got 'paged'"),
    ('colors=["red"]', "fuelpipe_matrix takes backends, kv, plans, oracles, yaml; unknown: colors"),
    ('yaml="missing.yaml"', "fuelpipe_matrix: no such YAML file"),
])
def test_a_misspelled_matrix_stops_collection_with_the_reason(pytester, marker, message):
    pytester.makepyfile(f"""
import pytest

@pytest.mark.fuelpipe_matrix({marker})
def test_gate(fuelpipe_combo, fuelpipe_oracle):
    pass
""")
    result = pytester.runpytest()
    assert result.ret != 0
    assert message in str(result.stdout) + str(result.stderr)


def test_the_harness_refuses_bad_arguments_with_typed_errors():
    from fuelpipe.errors import ConfigError
    from fuelpipe.testing import OracleHarness
    from models.registry import build_random_model

    model = build_random_model("llama", "tiny")
    with pytest.raises(ConfigError, match="exactly one of model="):
        OracleHarness()
    with pytest.raises(ConfigError, match=r"within the vocabulary \[0, 256\)"):
        OracleHarness(model, prompts=[[1, 2], [999]])
    with pytest.raises(ConfigError, match="new_tokens must be >= 4"):
        OracleHarness(model, new_tokens=2)
    with pytest.raises(ConfigError, match="model config 'no_such_model' could not be composed"):
        OracleHarness(config="no_such_model")
