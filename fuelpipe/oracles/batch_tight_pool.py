"""A paged pool too small for its requests: admission must wait for blocks, counting them rounding up.

The pool hands out ``USABLE`` blocks; a row could hold ``USABLE + 1`` blocks, so only the pool
(not the row's width) decides. Three requests, none a whole number of blocks long:

* ``tight-a``: block_size + 1 positions (2 blocks; 1 rounding down), admitted at once;
* ``tight-over``: 3 x block_size + 1 positions, 4 blocks: one more than the pool has, while
  rounding down (3) would fit. Refused at submission, alone;
* ``tight-b``: block_size + 1 positions. While ``tight-a`` runs, the free blocks (1) are exactly
  its need rounded down, one short of its need: it must wait, and join when ``tight-a`` leaves.

Both served requests must equal their solo runs; the structure is audited after every step.
"""
from __future__ import annotations

from fuelpipe.batch import Request
from fuelpipe.context import InferenceContext
from fuelpipe.errors import KvCapacityError
from fuelpipe.oracles.base import OracleInput
from fuelpipe.oracles.batch_compare import Tally
from fuelpipe.oracles.batch_runs import batcher, repeat_to, solo_runs
from fuelpipe.oracles.paged_invariants import serve_audited

USABLE = 3  # blocks the tight pool hands out (plus the null block)


def run_tight(solo_ctx: InferenceContext, inp: OracleInput, solo_capacity: int, tally: Tally) -> dict:
    """Run the scenario (paged only), adding its problems to ``tally``; returns its metrics. The solo
    references run on ``solo_ctx`` (plan_once) with caches of ``solo_capacity`` positions, or more."""
    bs = inp.setup.kv.block_size
    capacity = (USABLE + 1) * bs
    if bs < 3 or capacity > inp.model.dims.max_position_embeddings:
        return {"tight_pool": f"skipped: block_size {bs} (needs 3 <= block_size, {USABLE + 1} blocks within "
                              f"the model's {inp.model.dims.max_position_embeddings} positions)"}
    base = [t for p in inp.prompts for t in p] or [1, 2, 3]
    first = Request(repeat_to(base, bs - 1), 3, name="tight-a")
    over = Request(repeat_to(base[1:] or base, 3 * bs), 2, name="tight-over")
    second = Request(repeat_to(base[2:] or base, bs - 2), 4, name="tight-b")
    b = batcher(inp, capacity, num_blocks=USABLE + 1, keep_logits=True)
    a_res, over_res, b_res = (b.submit(r) for r in (first, over, second))
    if over_res.finish != "refused" or not isinstance(over_res.error, KvCapacityError):
        tally.problems.append(f"tight pool: {over.name} needs {-(-over.positions // bs)} blocks of {USABLE}, yet "
                              f"was {over_res.finish!r} at submission ({over_res.error!r}), not refused")
    b.step()  # tight-a joins and decodes; tight-b must wait
    free, need = b.kv.pool.free_blocks, second.positions
    if b_res.finish != "queued":
        tally.problems.append(f"tight pool: {second.name} needs {-(-need // bs)} blocks ({need} positions) with "
                              f"{free} free, yet was {b_res.finish!r} instead of waiting ({b_res.error})")
    elif not free == need // bs < -(-need // bs):
        tally.problems.append(f"tight pool: the scenario is not tight ({free} free blocks for {need} positions "
                              f"of block size {bs})")
    problems, audits = serve_audited(b)
    tally.problems += [f"tight pool: {p}" for p in problems]
    solo = solo_runs(solo_ctx, inp, (first, second), max(solo_capacity, first.positions))
    for res, (tokens, logits) in zip((a_res, b_res), solo):
        tally.greedy(res, tokens, logits, "tight pool: ")
    waited = b_res.admitted_step is not None and a_res.finished_step is not None \
        and b_res.admitted_step >= a_res.finished_step
    if b_res.finish in ("length", "stop") and not waited:
        tally.problems.append(f"tight pool: {second.name} joined at step {b_res.admitted_step}, before "
                              f"{first.name} left at step {a_res.finished_step} and freed its blocks")
    return {"tight_pool_waited": waited, "tight_pool_refused": over_res.finish == "refused",
            "tight_pool_audits": audits}
