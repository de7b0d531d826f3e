"""Batch write-set isolation: a batched step writes exactly one slot per live row per layer, nothing else.

The shared schedule runs through a ``ContinuousBatcher`` whose batch cache is
all NaN before anything runs. Before every batched step, every free slot (or
free block) and every position past a live row's length is re-poisoned with
NaN; after the step, each KV tensor is compared with its snapshot bit for bit:

* every live row's slot changed at exactly its write position (in every layer's tensors);
* nothing else changed, except the null slot / null block padding rows write;
* free slots and free blocks are bit-identical to their NaN poison.

The live rows' logits must then equal, bit for bit, the same schedule run
correctly on a clean (zeroed, never poisoned) cache: the NaN in padding rows, free slots
and unwritten positions never leaks into a live row. The negative control
injects STALE_PADDING_ROW (a padding row keeps the slot or block-table row
of the sequence that sat there last, after it left).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.kv.batch import PagedBatch
from fuelpipe.kv.batch_slots import NULL_SLOT
from fuelpipe.kv.paged import NULL_BLOCK
from fuelpipe.oracles.base import OracleInput, OracleResult, compare
from fuelpipe.oracles.batch_runs import batcher, schedule

ISOLATION_TOKENS = 12  # per request: enough for joins, leaves and padding rows; every step is checked in full


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view, so NaN compares equal to itself bit for bit."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class _Grid:
    """Where a KV tensor's units (slot x position, or block x offset) are, for one cache layout."""

    def __init__(self, kv) -> None:
        self.kv = kv
        self.paged = isinstance(kv, PagedBatch)

    def units(self, t: torch.Tensor, changed: torch.Tensor) -> torch.Tensor:
        """Bool [N, S] (slots x positions) or [NB, bs] (blocks x offsets): which units changed."""
        if self.paged:  # [NB, bs, Hkv, D]
            return changed.flatten(2).any(-1)
        if t.dim() == 4:  # batch-slot K/V [N, Hkv, S, D]
            return changed.any(-1).any(1)
        return changed.flatten(2).any(-1)  # latent [N, S, *trailing]

    @property
    def null_unit(self) -> int:
        return NULL_BLOCK if self.paged else NULL_SLOT


def _checked_steps(b, grid: Optional[_Grid], problems: list) -> None:
    """Wrap the batcher's decoder so every batched step is checked (when ``grid`` is set) against its write set."""
    step = b.decoder.step

    def checked(rows, tokens):
        if grid is None:
            return step(rows, tokens)
        rows = list(rows)
        for row in rows:
            row.check_room(row.cached_len, 1)  # a paged row's next block exists before the snapshot
        grid.kv.poison_unwritten(rows)  # the cache knows which of its units nothing may read
        before = [_bits(t).clone() for t in grid.kv.bound_tensors()]
        expected = [{grid.kv.write_unit(r, i) for r in rows} for i in range(len(before))]
        logits = step(rows, tokens)
        n = b.decoder.steps
        for i, (t, old) in enumerate(zip(grid.kv.bound_tensors(), before)):
            units = grid.units(t, _bits(t) != old)
            units[grid.null_unit] = False  # padding rows write there
            got = {tuple(u) for u in units.nonzero().tolist()}
            if got - expected[i]:
                problems.append(f"step {n}, KV tensor {i}: wrote {sorted(got - expected[i])[:4]} outside the live rows' "
                                f"write set {sorted(expected[i])[:4]}")
            if expected[i] - got:
                problems.append(f"step {n}, KV tensor {i}: live rows' writes {sorted(expected[i] - got)[:4]} missing")
        return logits

    b.decoder.step = checked


def _serve(inp: OracleInput, sched, poisoned: bool, problems: list):
    ctx = None
    if not poisoned:  # the clean reference holds its plans: replan builds the same program, bit for bit
        ctx = inp.setup.context(inp.model, plan=PlanMode.plan_once, fault=inp.fault)
    b = batcher(inp, sched.capacity, ctx=ctx, keep_logits=True)
    if poisoned:
        for t in b.kv.bound_tensors():
            t.fill_(float("nan"))
    _checked_steps(b, _Grid(b.kv) if poisoned else None, problems)
    results = b.run(sched.requests)
    return b, results


def run(inp: OracleInput) -> OracleResult:
    sched = schedule(inp, min_tokens=ISOLATION_TOKENS)
    sched = type(sched)(tuple(type(r)(r.prompt_ids, ISOLATION_TOKENS + r.max_new_tokens % 4, name=r.name)
                              for r in sched.requests), sched.refused, sched.capacity)
    problems: list[str] = []
    b, poisoned = _serve(inp, sched, True, problems)
    _, clean = _serve(dataclasses.replace(inp, fault=Fault.NONE), sched, False, problems)  # correct and clean
    worst, rows = 0.0, 0
    for p, c in zip(poisoned, clean):
        if p.finish not in ("length", "stop"):
            problems.append(f"{p.request.name} ended {p.finish!r} on the poisoned cache: {p.error}")
            continue
        if p.tokens != c.tokens:
            problems.append(f"{p.request.name}: tokens differ from the clean-cache run ({p.tokens[:4]} vs {c.tokens[:4]})")
        n = min(len(p.logits), len(c.logits))
        err, first = compare(c.logits[:n], p.logits[:n])
        worst, rows = max(worst, err), rows + n
        if first is not None:
            problems.append(f"{p.request.name}: logits differ from the clean-cache run from token {first} (max {err:.3g})")
    d = b.describe()
    padding_steps = sum(n not in b.decoder.spec.buckets for n in b.batch_sizes)
    if not padding_steps:
        problems.append(f"the schedule never ran a padding row (batch sizes {sorted(set(b.batch_sizes))}, buckets "
                        f"{list(b.decoder.spec.buckets)}): nothing about padding was checked")
    return OracleResult(
        name="batch_isolation",
        passed=not problems,
        metric={"steps_checked": d["steps"], "kv_tensors": len(b.kv.bound_tensors()), "rows_compared": rows,
                "max_abs_error": worst, "padding_steps": padding_steps,
                "violations": len(problems)},
        tolerance=0.0,
        detail="; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
        if problems else
        f"{d['steps']} batched steps ({padding_steps} with padding rows) each wrote exactly the live rows' slots in "
        f"all {len(b.kv.bound_tensors())} KV tensors; free slots stayed NaN; {rows} logits rows bit-exact against a "
        "clean cache",
    )
