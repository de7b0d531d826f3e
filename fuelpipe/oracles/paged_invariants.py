"""Structural invariants of paged KV bookkeeping, read from the block tables and the pool itself.

A bug in the bookkeeping (a block table keeping ids after ``free()``, a block both
free and owned, a block nobody holds) often leaves every logit right for a while:
the stale id is masked, or the doubly owned block is not yet overwritten. These
checks look at the structure directly, after each operation an oracle performs:

* a sequence's table holds exactly the blocks it owns, in order, then the null block;
  it owns no block twice, never the null block, and enough blocks for its length;
* the pool's free list and the blocks its live sequences own partition blocks
  1 .. num_blocks - 1: nothing twice, nothing missing.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from fuelpipe.kv.batch import PagedBatch
from fuelpipe.kv.paged import NULL_BLOCK, KvBlockPool, PagedSequence


def sequence_problems(seq: PagedSequence, label: str) -> list[str]:
    """What is wrong with one sequence's block table against the blocks it owns ([] when nothing)."""
    owned = list(seq.blocks)
    table = seq.block_table()[0].tolist()  # [max_blocks_cap]
    problems = []
    if table[: len(owned)] != owned:
        problems.append(f"{label}: block table starts {table[:len(owned)]}, but the sequence owns {owned}")
    stale = [(i, b) for i, b in enumerate(table[len(owned):], start=len(owned)) if b != NULL_BLOCK]
    if stale:
        problems.append(f"{label}: block table names (entry, block) {stale[:4]} past its {len(owned)} owned blocks "
                        "(expected the null block there)")
    if NULL_BLOCK in owned or len(set(owned)) != len(owned):
        problems.append(f"{label}: owns {owned}: the null block or a block twice")
    need = -(-seq.cached_len // seq.pool.block_size)
    if len(owned) < need:
        problems.append(f"{label}: holds {seq.cached_len} positions in {len(owned)} blocks, needs {need}")
    return problems


def pool_problems(pool: KvBlockPool, owners: Iterable[PagedSequence], label: str) -> list[str]:
    """Whether the free list and the owners' blocks partition the pool's usable blocks ([] when they do)."""
    counts = Counter(pool.free_block_ids())
    for seq in owners:
        counts.update(seq.blocks)
    usable = set(range(NULL_BLOCK + 1, pool.num_blocks))
    twice = sorted(b for b, n in counts.items() if n > 1)
    missing = sorted(usable - set(counts))
    foreign = sorted(set(counts) - usable)
    problems = []
    if twice:
        problems.append(f"{label}: blocks {twice[:6]} are both free and owned, or owned twice")
    if missing:
        problems.append(f"{label}: blocks {missing[:6]} are neither free nor owned (leaked)")
    if foreign:
        problems.append(f"{label}: blocks {foreign[:6]} are outside the pool's 1..{pool.num_blocks - 1}")
    return problems


def audit(live: Sequence[PagedSequence], released: Sequence[PagedSequence], pool: KvBlockPool, label: str) -> list[str]:
    """Every live sequence's table, every released one's (empty: all null), and the pool's partition."""
    problems = [p for seq in live for p in sequence_problems(seq, f"{label}, live sequence")]
    for seq in released:
        problems += sequence_problems(seq, f"{label}, released sequence")
        if seq.blocks:
            problems.append(f"{label}: a released sequence still owns blocks {seq.blocks[:6]}")
    return problems + pool_problems(pool, live, label)


class AuditedRows:
    """Watches a ``PagedBatch``: records the rows it releases, and audits it after each batched step."""

    def __init__(self, kv: PagedBatch) -> None:
        self.kv, self.released, self.problems, self.audits = kv, [], [], 0
        release = kv.release

        def recorded(handle) -> None:
            release(handle)
            self.released.append(handle)

        kv.release = recorded

    def check(self, when: str) -> None:
        self.audits += 1
        self.problems += audit(self.kv.held, self.released, self.kv.pool, when)


def serve_audited(b) -> tuple[list[str], int]:
    """Run the batcher ``b`` to completion; on a paged batch, audit the structure after every step.

    Returns (problems, audits run); no audits on a batch-slot cache (it has no block bookkeeping).
    """
    watch = AuditedRows(b.kv) if isinstance(b.kv, PagedBatch) else None
    while b.step():
        if watch is not None:
            watch.check(f"after batched step {b.decoder.steps}")
    if watch is None:
        return [], 0
    watch.check("after the run")
    return watch.problems, watch.audits
