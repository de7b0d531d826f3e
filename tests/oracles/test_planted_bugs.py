"""The default gate against bugs it was not designed around: each planted, one at a time, must fail parity.

Every bug below is a few lines changed in one place, of a kind real engines
shipped (paged block bookkeeping, RoPE rows, window boundaries, weight
identity, masked garbage, cache rollback, block tables, fused biases, thread
splits). None of them is one of ``fuelpipe.oracles.faults.Fault``: the gate has no
switch for them. Each runs ``experiment=parity`` in-process on a tiny model,
as a CI user's gate would, and must end with status ``failed`` (exit 1).
Bugs in the C++ kernels cannot be monkeypatched: ``tests/kernels/planted_kernels.py`` plants those in
scratch copies of the tree. The recorded run is ``experiments/planted_bugs_cpu/``.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import fuelpipe.context as context_mod
import fuelpipe.kv.views as views_mod
import fuelpipe.masks as masks_mod
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.paged import KvBlockPool, PagedSequence
from fuelpipe.plan import fx_passes, linear_forms
from fuelpipe.plan import split_gemv
from fuelpipe.plan.token_data import StepBuffers, compute_token_host
from fuelpipe.plan.weights_identity import _TreeWatch
from fuelpipe.rope import RopeSpec
from fuelpipe.runner.job import run_job
from _support.planted_batch import BUGS as BATCH_BUGS
from _support.planted_gate import (
    plan_key_without_pass_sources, plan_key_without_threads, quantizer_sixteen_intervals, yarn_attention_factor_dropped,
)
from _support.planted_record import record

pytestmark = pytest.mark.slow


def paged_block_boundary(mp):
    """The first position of every block but the first is written into the previous block."""
    def write_index(self, start, n):
        bs = self.pool.block_size
        rows = [self.blocks[(p - 1) // bs if p and p % bs == 0 else p // bs] * bs + p % bs for p in range(start, start + n)]
        return torch.tensor(rows, dtype=torch.int64)
    mp.setattr(PagedSequence, "write_index", write_index)


def pool_hands_out_a_block_twice(mp):
    """allocate() leaves the last block it hands out on the free list: a later request owns it too."""
    original = KvBlockPool.allocate

    def allocate(self, n):
        taken = original(self, n)
        self._free.insert(0, taken[-1])
        return taken
    mp.setattr(KvBlockPool, "allocate", allocate)


def decode_rope_rows_one_ahead(mp):
    """Decode steps take their RoPE rows one position late (cos[cached_len + 1]); the prefill is right.

    (Shifting every position alike would be no bug: RoPE scores depend on position differences only.)
    """
    def host(token_ids, cos, sin, *args, **kwargs):
        if token_ids.shape[1] == 1:
            cos, sin = cos[:, 1:], sin[:, 1:]
        return compute_token_host(token_ids, cos, sin, *args, **kwargs)
    mp.setattr(context_mod, "compute_token_host", host)


def window_boundary_off_by_one(mp):
    """Sliding layers attend one position more than the window (shared by every fuelpipe mask)."""
    def allowed(q_pos, k_pos, window):
        ok = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            ok = ok & (q_pos[:, None] - k_pos[None, :] <= window)
        return ok
    mp.setattr(masks_mod, "allowed", allowed)


def rope_base_in_shared_code(mp):
    """The inverse frequencies use 1.5 x theta: decode path and fuelpipe's own reference both read them."""
    original = RopeSpec.inv_freq
    mp.setattr(RopeSpec, "inv_freq", lambda self: original(dataclasses.replace(self, theta=self.theta * 1.5)))


def fused_linears_drop_bias(mp):
    """fuse_sibling_linears concatenates the weights but leaves the fused bias at zero."""
    original = fx_passes.fuse_sibling_linears

    def fuse(gm):
        fused = original(gm)
        for name, mod in gm.named_children():
            if name.startswith("fused_linear") and mod.bias is not None:
                mod.bias.data.zero_()
        return fused
    registered = fx_passes.FX_PASSES
    entry = (fx_passes.FxPass("fuse_sibling_linears", fuse), registered.source("fuse_sibling_linears"))
    mp.setitem(registered._all(), "fuse_sibling_linears", entry)  # the registry's live table, restored by mp


def identity_blind_to_storage(mp):
    """The weight identity compares objects and versions but not storages (misses `.data =`)."""
    original = _TreeWatch.read

    def read(self):
        identity, objects = original(self)
        return dataclasses.replace(identity, storages=()), objects
    mp.setattr(_TreeWatch, "read", read)


def masked_garbage_reaches_attention(mp):
    """The live-slot test lets every slot through: masked KV reaches attention as it is (0 x NaN = NaN)."""
    mp.setattr(views_mod, "live_slots_as", lambda mask, slot_dim: torch.ones((), dtype=torch.bool))


def truncate_forgets_to_rewind(mp):
    """truncate_to accepts the length but does not rewind the cache."""
    mp.setattr(ContiguousKvCache, "truncate_to", lambda self, new_len: None)


def block_table_baked_at_build(mp):
    """The held plan keeps the block table of its build token (not rebound per token)."""
    original = StepBuffers.load

    def load(self, host, **kwargs):
        table = self.block_table
        if getattr(self, "_loaded_once", False):
            self.block_table = None
        original(self, host, **kwargs)
        self.block_table, self._loaded_once = table, True
    mp.setattr(StepBuffers, "load", load)


def split_ignores_divisibility(mp):
    """The thread split assumes every output width divides by the thread count."""
    mp.setattr(split_gemv, "worth_splitting", lambda w, parts: w.device.type == "cpu" and parts >= 2
               and w.numel() >= split_gemv.MIN_SPLIT_ELEMENTS)
    mp.setattr(linear_forms, "worth_splitting", split_gemv.worth_splitting)


def attended_length_one_short(mp):
    """Symbol path: the live length excludes the position written this step."""
    def host(*args, **kwargs):
        h = compute_token_host(*args, **kwargs)
        return dataclasses.replace(h, attended_len=h.attended_len - 1)
    mp.setattr(context_mod, "compute_token_host", host)


# name -> (plant, gate overrides)
BUGS = {
    "paged_block_boundary": (paged_block_boundary, ["model=llama_tiny", "kv=paged"]),
    "pool_hands_out_a_block_twice": (pool_hands_out_a_block_twice, ["model=qwen3_tiny", "kv=paged"]),
    "decode_rope_rows_one_ahead": (decode_rope_rows_one_ahead, ["model=llama_tiny"]),
    "window_boundary_off_by_one": (window_boundary_off_by_one, ["model=gemma3_tiny"]),
    "rope_base_in_shared_code": (rope_base_in_shared_code, ["model=llama_tiny"]),
    "fused_linears_drop_bias": (fused_linears_drop_bias, ["model=llama_tiny"]),
    "identity_blind_to_storage": (identity_blind_to_storage, ["model=qwen3_tiny"]),
    "masked_garbage_reaches_attention": (masked_garbage_reaches_attention, ["model=llama_tiny", "kv=paged"]),
    "truncate_forgets_to_rewind": (truncate_forgets_to_rewind, ["model=phi_tiny"]),
    "block_table_baked_at_build": (block_table_baked_at_build, ["model=gemma3_tiny", "kv=paged"]),
    "split_ignores_divisibility": (split_ignores_divisibility, ["model=llama_tiny"]),
    "attended_length_one_short": (attended_length_one_short, ["model=phi_tiny"]),
    # issue 34: classes the gate missed
    "yarn_attention_factor_dropped": (yarn_attention_factor_dropped, ["model=llama_tiny"]),
    "quantizer_sixteen_intervals": (quantizer_sixteen_intervals, ["model=llama_tiny", "weights.dtype=int4"]),
    "plan_key_without_threads": (plan_key_without_threads, ["model=llama_tiny"]),
    "plan_key_without_pass_sources": (plan_key_without_pass_sources, ["model=qwen3_tiny"]),
    **BATCH_BUGS,  # seeded sampling, the batch symbol path, paged admission, free()'s block table
}


@pytest.mark.parametrize("name", sorted(BUGS))
def test_parity_gate_fails_on_planted_bug(compose_cfg, monkeypatch, name):
    plant, overrides = BUGS[name]
    # A study run records every oracle that catches the bug; CI asks only whether the gate fails, so the
    # gate stops at its first failing oracle (experiment.fail_fast).
    recording = bool(os.environ.get("FUELPIPE_PLANTED_RECORD"))
    cfg = compose_cfg(["experiment=parity", *overrides, f"experiment.fail_fast={str(not recording).lower()}"])
    healthy_first = os.environ.get("FUELPIPE_PLANTED_HEALTHY") == "1"
    if healthy_first:  # the same gate on the healthy code passes (slow: doubles the run)
        assert run_job(cfg)["status"] == "ok"
    plant(monkeypatch)
    doc = run_job(cfg)
    caught = [o["name"] for o in doc["oracles"] if not o["passed"] and not o.get("skipped")]
    record(name, [*overrides, "experiment=parity"], caught, doc["status"])
    assert doc["status"] == "failed" and caught, f"{name} slipped through the gate"
