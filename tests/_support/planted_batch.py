"""Planted bugs in continuous batching and paged bookkeeping that ``experiment=parity`` must catch.

Each is a pytest monkeypatch of a few lines, of a class the gate once missed (issue 34); none is a
``fuelpipe.oracles.faults.Fault``. ``BUGS`` has the shape of ``tests/oracles/test_planted_bugs.py``'s:
name -> (plant(monkeypatch), gate overrides).
"""
from __future__ import annotations

import dataclasses

import torch

from fuelpipe.batch.decoder import BatchDecoder
from fuelpipe.batch.scheduler import ContinuousBatcher, Sampling
from fuelpipe.kv.batch import PagedBatch
from fuelpipe.kv.paged import PagedSequence
from fuelpipe.sampling import draw, greedy


def sampling_shares_one_generator(mp):
    """Every seeded request draws from one generator (seeded once, by the first request made)."""
    shared: list[torch.Generator] = []

    def sampler(self, prompt_ids=()):
        if self.temperature == 0:
            return greedy
        if not shared:
            shared.append(torch.Generator().manual_seed(self.seed))
        return lambda logits: draw(logits, self.temperature, self.top_k, shared[0])
    mp.setattr(Sampling, "sampler", sampler)


def batch_attended_length_from_row_0(mp):
    """The batch symbol path attends row 0's length (+1), not the longest row's."""
    original = BatchDecoder._host

    def host(self, rows, ids, bucket):
        h = original(self, rows, ids, bucket)
        return dataclasses.replace(h, cached_len=rows[0].cached_len, attended_len=rows[0].cached_len + 1)
    mp.setattr(BatchDecoder, "_host", host)


def admission_counts_blocks_rounding_down(mp):
    """Admission counts a request's blocks as positions // block_size (the partial last block forgotten)."""
    def fits_now(self, req):
        if not self.kv.free_rows:
            return False
        if isinstance(self.kv, PagedBatch):
            return req.positions // self.kv.pool.block_size <= self.kv.pool.free_blocks
        return True

    original = ContinuousBatcher._never_fits

    def never_fits(self, req):
        if isinstance(self.kv, PagedBatch):  # judge the request as if its partial last block did not exist
            bs = self.kv.pool.block_size
            req = dataclasses.replace(req, max_new_tokens=req.max_new_tokens - req.positions % bs)
        return original(self, req)
    mp.setattr(ContinuousBatcher, "_fits_now", fits_now)
    mp.setattr(ContinuousBatcher, "_never_fits", never_fits)


def free_leaves_stale_block_ids(mp):
    """PagedSequence.free returns the blocks but leaves their ids in the block table."""
    def free(self):
        self.pool.release(self.blocks)
        self.blocks = []
        self.cached_len = 0
    mp.setattr(PagedSequence, "free", free)


# name -> (plant, gate overrides)
BUGS = {
    "sampling_shares_one_generator": (sampling_shares_one_generator, ["model=llama_tiny"]),
    "batch_attended_length_from_row_0": (batch_attended_length_from_row_0, ["model=llama_tiny"]),
    "admission_counts_blocks_rounding_down": (admission_counts_blocks_rounding_down, ["model=llama_tiny", "kv=paged"]),
    "free_leaves_stale_block_ids": (free_leaves_stale_block_ids, ["model=llama_tiny", "kv=paged"]),
}
