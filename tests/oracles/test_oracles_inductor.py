"""The one inductor run: vs_reference through a compiled plan (compiling costs ~20 s, hence slow)."""
from __future__ import annotations

import pytest

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one


@pytest.mark.slow
def test_vs_reference_on_inductor(compose_cfg):
    cfg = compose_cfg(["backend=inductor", "experiment.new_tokens=4"])
    result = run_one(cfg, assemble(cfg), ORACLES["vs_reference"])
    assert result.passed, result.detail
    assert result.setup["backend"] == "inductor" and result.metric["max_abs_error"] <= result.tolerance
