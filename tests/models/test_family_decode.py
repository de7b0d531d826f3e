"""Every family through the one shared driver: plan reuse, plan accounting, and the family's own reference.

Families come from the registry at their ``tiny`` size. The decode runs a
prompt plus 24 teacher-forced tokens, so every boundary of the tiny configs'
8-position window is crossed (replan, which rebuilds per token, runs the
first 16 of them). Negative controls: each corruption of the
decode-side data must make the own-reference oracle fail.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from _support.family_helpers import FAULT_CASES, FAULTS, forced_tokens, max_err, reference_rows, run_decode
from fuelpipe.backbone import OFFSET_MODES
from fuelpipe.oracles.faults import Fault
from models.registry import build_random_model, families

FAMILIES = ("llama", "phi", "qwen3", "gemma3")
SEED = 3
REF_TOL = 1e-5  # f32, cached decode against the no-cache reference
CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"


@functools.lru_cache(maxsize=None)
def tiny(fam: str):
    return build_random_model(fam, "tiny", seed=SEED)


REPLAN_STEPS = 16  # replan traces a program per token: 16 tokens still cross two window boundaries


@functools.lru_cache(maxsize=None)
def runs(fam: str):
    """(plan_once over 24 tokens, replan over the first 16) on the family's own offset path, fx backend."""
    tokens = forced_tokens()
    return run_decode(tiny(fam), tokens), run_decode(tiny(fam), tokens[:REPLAN_STEPS], plan="replan")


@pytest.mark.parametrize("fam", FAMILIES)
def test_plan_once_equals_replan_bit_exact(fam):
    once, replan = runs(fam)
    assert once.ctx.offset_mode == tiny(fam).offset_mode
    assert len(replan.logits) == REPLAN_STEPS + 1
    for step, (a, b) in enumerate(zip(once.logits, replan.logits)):
        assert torch.equal(a, b), f"{fam}: first divergence at step {step}"


@pytest.mark.parametrize("fam", FAMILIES)
def test_plan_accounting(fam):
    once, replan = runs(fam)
    steps = len(once.builds)
    assert once.builds == [1] * steps, "plan_once must build exactly once"
    assert once.realize_counts == list(range(steps)), "realize_count must advance by one per reused token"
    assert once.node_counts[0] is not None and len(set(once.node_counts)) == 1, once.node_counts
    assert replan.builds == list(range(1, REPLAN_STEPS + 1)), "replan must build every token"
    assert once.ctx.plan.stats.refusals == [] and once.ctx.plan.stats.rebinds == 0


def test_plan_oracles_can_fail():
    """Negative controls: a held plan that keeps its build-time offsets diverges from replan (Phi, symbol
    path); a plan_once that silently rebuilds every token breaks the accounting (every family)."""
    once, replan = runs("phi")
    stale = run_decode(tiny("phi"), forced_tokens()[:REPLAN_STEPS], fault=Fault.STALE_OFFSET)
    assert torch.equal(once.logits[:2], stale.logits[:2])  # the build token itself is right
    assert not torch.equal(stale.logits, replan.logits)
    for fam in FAMILIES:
        rebuilt = run_decode(tiny(fam), forced_tokens()[:4], fault=Fault.REBUILD_EVERY_TOKEN)
        assert rebuilt.builds == [1, 2, 3, 4]


@pytest.mark.parametrize("offset_mode", OFFSET_MODES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_cached_decode_matches_own_reference(fam, offset_mode):
    model = tiny(fam)
    got = runs(fam)[0] if offset_mode == model.offset_mode else run_decode(model, forced_tokens(), offset_mode=offset_mode)
    err = max_err(got.logits, reference_rows(model, got))
    assert err <= REF_TOL, f"{fam} on the {offset_mode} path: max abs error {err:.3g}"


@pytest.mark.parametrize("fam,fault", FAULT_CASES)
def test_own_reference_catches_fault(fam, fault):
    model = build_random_model(fam, "tiny", seed=SEED)
    FAULTS[fault][0](model)
    got = run_decode(model, forced_tokens())
    err = max_err(got.logits, reference_rows(model, got))
    assert err > REF_TOL, f"{fault} went unnoticed by the {fam} reference ({err:.3g} <= {REF_TOL})"


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f != "llama"])
def test_family_is_registered_with_a_tiny_model_config(fam):
    entry = families()[fam]
    assert entry.model_cls.family == fam and "tiny" in entry.sizes
    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{fam}_tiny.yaml"))
    assert conf == {"family": fam, "size": "tiny", "dtype": "float32", "weights": "random", "seed": 0, "path": None}
    model = build_random_model(conf["family"], conf["size"], seed=conf["seed"], dtype=getattr(torch, conf["dtype"]))
    assert model.dims.n_layers >= 2
