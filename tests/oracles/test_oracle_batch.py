"""The three batch oracles on every family x KV strategy: each passes, and each fails under its own fault."""
import pytest
import torch

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from conftest import default_or_slow
from fuelpipe.batch.scheduler import ContinuousBatcher, Sampling
from fuelpipe.batch import scheduler
from fuelpipe.sampling import draw, greedy, seeded
from _support.planted_batch import BUGS

CASES = [("llama_tiny", "contiguous", "tensor"), ("llama_tiny", "paged", "symbol"), ("phi_tiny", "contiguous", "symbol"),
         ("phi_tiny", "paged", "tensor"), ("qwen3_tiny", "contiguous", "tensor"), ("qwen3_tiny", "paged", "tensor"),
         ("gemma3_tiny", "contiguous", "symbol"), ("gemma3_tiny", "paged", "tensor"),
         ("deepseek_v2_tiny", "latent", "tensor"), ("deepseek_v2_tiny_dense", "latent", "tensor")]
# llama contiguous runs in test_oracles_controls; gemma3's per-row windows in test_batch_decode.
KEEP = [("llama_tiny", "paged", "symbol"), ("deepseek_v2_tiny", "latent", "tensor")]
ORACLE_NAMES = ("batch_vs_solo", "batch_isolation", "batch_plan_accounting")
SMALL = ["batch.max_batch=4", "batch.buckets=[1,2,4]", "experiment.new_tokens=6"]


def _run(compose_cfg, overrides, name):
    cfg = compose_cfg(overrides)
    return run_one(cfg, assemble(cfg), ORACLES[name])


@pytest.mark.parametrize("model,kv,offset", default_or_slow(CASES, KEEP))
@pytest.mark.parametrize("name", ORACLE_NAMES)
def test_batch_oracle_passes_and_its_control_fails(compose_cfg, model, kv, offset, name):
    base = [f"model={model}", f"kv={kv}", f"plan.offset_mode={offset}", *SMALL]
    healthy = _run(compose_cfg, base, name)
    assert healthy.passed, healthy.detail
    control = _run(compose_cfg, [*base, f"experiment.oracles.{name}.inject_fault=true"], name)
    assert not control.passed, f"{name}'s negative control passed: {control.detail}"
    assert control.fault == ORACLES[name].fault.value


def test_batch_vs_solo_compares_at_least_32_tokens_per_request_with_joins(compose_cfg):
    r = _run(compose_cfg, ["model=llama_tiny", *SMALL], "batch_vs_solo")
    assert r.passed, r.detail
    assert r.metric["min_tokens"] >= 32 and r.metric["requests"] == 6 and r.metric["refused"] == 1
    assert r.metric["mean_batch"] > 1 and set(r.metric["builds_per_bucket"]) == {1, 2, 4}
    # three seeded sampled requests, two of them twins (one stream), and the batch symbol path run too
    assert r.metric["sampled_requests"] == 3 and r.metric["sampled_streams"] == 2
    assert r.metric["offset_paths"] == ["batch", "batch_symbol"] and "tight_pool_waited" not in r.metric


def test_batch_isolation_checks_padding_rows_and_every_kv_tensor(compose_cfg):
    r = _run(compose_cfg, ["model=qwen3_tiny", "kv=paged", *SMALL], "batch_isolation")
    assert r.passed, r.detail
    layers = assemble(compose_cfg(["model=qwen3_tiny"])).model.dims.n_layers
    assert r.metric["padding_steps"] >= 1 and r.metric["kv_tensors"] == 2 * layers  # every layer's K and V pool
    assert r.metric["rows_compared"] > 20


def test_batch_plan_accounting_sees_row_changes_inside_a_bucket(compose_cfg):
    r = _run(compose_cfg, ["model=llama_tiny", *SMALL], "batch_plan_accounting")
    assert r.passed, r.detail
    assert r.metric["builds"] == len(r.metric["buckets_used"]) == 3
    assert r.metric["row_changes_inside_bucket"] >= 1 and r.metric["replan_builds"] == r.metric["replan_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ORACLE_NAMES)
def test_batch_oracles_on_inductor(compose_cfg, name):
    base = ["model=llama_tiny", "backend=inductor", *SMALL]
    healthy = _run(compose_cfg, base, name)
    assert healthy.passed, healthy.detail


# ---- issue 34: the classes the gate missed, each planted, each caught by batch_vs_solo --------------
def test_batch_vs_solo_serves_a_tight_paged_pool_and_audits_it(compose_cfg):
    r = _run(compose_cfg, ["model=llama_tiny", "kv=paged", *SMALL], "batch_vs_solo")
    assert r.passed, r.detail
    assert r.metric["tight_pool_waited"] and r.metric["tight_pool_refused"] and r.metric["tight_pool_audits"] >= 3
    assert r.metric["offset_paths"] == ["paged", "paged_symbol"] and r.metric["structure_audits"] > 20


def _reseeded_every_step(mp):
    def sampler(self, prompt_ids=()):
        if self.temperature == 0:
            return greedy
        return lambda logits: draw(logits, self.temperature, self.top_k, torch.Generator().manual_seed(self.seed))
    mp.setattr(Sampling, "sampler", sampler)


def _seeded_from_the_row(mp):
    """Each seeded request's generator is seeded with the batch slot it runs in, not its own seed."""
    original = scheduler._Running.__init__

    def init(self, result, handle, sampler, stops):
        s = result.request.sampling
        if s.temperature > 0:
            sampler = seeded(s.temperature, s.top_k, handle.slot)
        original(self, result, handle, sampler, stops)
    mp.setattr(scheduler._Running, "__init__", init)


def _fits_now_rounding_down(mp):
    BUGS["admission_counts_blocks_rounding_down"][0](mp)
    mp.setattr(ContinuousBatcher, "_never_fits", _ORIGINAL_NEVER_FITS)


def _never_fits_rounding_down(mp):
    BUGS["admission_counts_blocks_rounding_down"][0](mp)
    mp.setattr(ContinuousBatcher, "_fits_now", _ORIGINAL_FITS_NOW)


_ORIGINAL_NEVER_FITS, _ORIGINAL_FITS_NOW = ContinuousBatcher._never_fits, ContinuousBatcher._fits_now
# planted bug -> (plant, layout, what batch_vs_solo's detail must say)
PLANTED = {
    "shared generator": (BUGS["sampling_shares_one_generator"][0], "contiguous", "is not its own"),
    "reseeded every step": (_reseeded_every_step, "contiguous", "is not its own"),
    "seeded from the row": (_seeded_from_the_row, "contiguous", "is not its own"),
    "attended length from row 0": (BUGS["batch_attended_length_from_row_0"][0], "contiguous", "[batch_symbol] r"),
    "admission waits rounding down": (_fits_now_rounding_down, "paged", "tight pool: tight-b"),
    "refusal rounding down": (_never_fits_rounding_down, "paged", "tight pool: tight-over"),
    "free leaves stale ids": (BUGS["free_leaves_stale_block_ids"][0], "paged", "released sequence: block table"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_batch_vs_solo_catches_the_planted_class(compose_cfg, monkeypatch, bug):
    plant, kv, said = PLANTED[bug]
    plant(monkeypatch)
    r = _run(compose_cfg, ["model=llama_tiny", f"kv={kv}", *SMALL], "batch_vs_solo")
    assert not r.passed and said in r.detail, r.detail
