"""Faulty strategies: what each negative control installs in place of a correct one.

Production code exposes seams (``fuelpipe.plan.policy.PlanPolicy``'s hooks, a
``DecodeSession`` subclass, a step signature's view factory, fx passes given by
value, the spec hooks ``BackendSpec.bound_weights`` and ``PlanCacheSpec.filed_key``)
and knows no fault. Here each ``Fault`` is a ``PlanPolicy`` that breaks exactly
one rule; ``policy_for(fault)`` is what an oracle hands its context for the
negative control. The faulty mechanisms the policies install live beside them:
``views`` (masked garbage), ``fx_passes`` (wrong passes and linear forms) and
``specs`` (a plan cache blind to weights, misbound AOT weights). Faults that are
not a plan policy (planted shared code, kernel inputs, quantized scales) stay
with their oracles.
"""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import replace
from typing import Callable, Optional

import torch

from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty.fx_passes import passes_under
from fuelpipe.oracles.faulty.specs import MisboundAot, PlanCacheIgnoringWeights, recast
from fuelpipe.oracles.faulty.views import step_keeping_masked_garbage
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.policy import DEFAULT_POLICY, PlanPolicy
from fuelpipe.plan.session import DecodeSession
from fuelpipe.plan.token_data import TokenHostData
from fuelpipe.plan.validity import PlanKey
from fuelpipe.plan.weights_identity import WeightsIdentity

IGNORED_WEIGHTS = WeightsIdentity((), (), (), ())  # what a key blind to the model's identity holds


# ---- sessions ---------------------------------------------------------------------------
class StaleOffsetSession(DecodeSession):
    """Keeps the offset (write index, cached and attended lengths) of the build token forever."""

    _built: Optional[TokenHostData] = None

    def _token_data(self, host: TokenHostData) -> TokenHostData:
        if self._built is None:
            self._built = replace(host, write_index=host.write_index.clone())
        b = self._built
        return replace(host, write_index=b.write_index, cached_len=b.cached_len, attended_len=b.attended_len)


class PartialRebindSession(DecodeSession):
    """Commits each slot as it passes the rebind check, so a refusal leaves a half-rebound plan."""

    def _slot_checked(self, index: int, incoming: torch.Tensor) -> None:
        self._kv_bound[index] = incoming


# ---- policies ---------------------------------------------------------------------------
class StaleOffset(PlanPolicy):
    session_class = StaleOffsetSession


class PartialRebind(PlanPolicy):
    session_class = PartialRebindSession


class IgnoreModelIdentity(PlanPolicy):
    def key(self, key: PlanKey) -> PlanKey:
        return replace(key, shape_key=0, weights=IGNORED_WEIGHTS)


class IgnoreAllocation(PlanPolicy):
    def key(self, key: PlanKey) -> PlanKey:
        return replace(key, alloc_id=None)


class RebuildEveryToken(PlanPolicy):
    def reuses_plans(self) -> bool:
        return False


class UnsafeMaskedSlots(PlanPolicy):
    def step_module(self, backbone, signature):
        return step_keeping_masked_garbage(backbone, signature)


class StaleRope(PlanPolicy):
    def tables_kept_on_rope_change(self, tables):
        return tables  # keeps serving the old rows


class SharedBatchPosition(PlanPolicy):
    def batch_positions(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[:1].expand(len(positions)).clone()  # row 0's position serves every row


class StalePaddingRow(PlanPolicy):
    """A padding row keeps the slot (or block table) of the sequence that last sat in that bucket row."""

    def __init__(self) -> None:
        self._last: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # batch cache -> last rows' data

    def row_data(self, kv, rows: list, positions: torch.Tensor, where: dict) -> dict:
        last = self._last.get(kv, [])
        for i, row in enumerate(rows):
            if row is not None or i >= len(last) or last[i] is None:
                continue
            if "block_table" in where:  # a paged row: the old table, and the write offset it gives
                bs, p = kv.pool.block_size, int(positions[i])
                where["block_table"][i] = last[i]
                where["write_index"][i] = int(last[i][p // bs]) * bs + p % bs
            else:
                where["slot_ids"][i] = last[i]
        self._last[kv] = [None if r is None else kv.slot_of_row(r) for r in rows]
        return where


class RebuildOnJoin(PlanPolicy):
    def bucket_key(self, rows: list) -> tuple:
        return (("rows", tuple(id(r) for r in rows)),)  # keyed on which sequences are live


class PackedPrefillCrossRows(PlanPolicy):
    def packed_segment(self, segment: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(segment)  # one segment: causal over the whole packed row


class FaultyPasses(PlanPolicy):
    """Builds with the fault's faulty fx pass in place of the correct one."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def backend(self, spec: BackendSpec) -> BackendSpec:
        return dataclasses.replace(spec, fx_passes=passes_under(self.fault, spec.fx_passes))


class AotConstantsMisbound(PlanPolicy):
    def backend(self, spec: BackendSpec) -> BackendSpec:
        return recast(MisboundAot, spec)


class PlanCacheIgnoresWeights(PlanPolicy):
    def backend(self, spec: BackendSpec) -> BackendSpec:
        return dataclasses.replace(spec, plan_cache=recast(PlanCacheIgnoringWeights, spec.plan_cache))


# Factories, so every context gets its own policy (StalePaddingRow remembers rows per batch cache).
POLICIES: dict[Fault, Callable[[], PlanPolicy]] = {
    Fault.STALE_OFFSET: StaleOffset,
    Fault.PARTIAL_REBIND: PartialRebind,
    Fault.IGNORE_MODEL_IDENTITY: IgnoreModelIdentity,
    Fault.IGNORE_ALLOCATION: IgnoreAllocation,
    Fault.REBUILD_EVERY_TOKEN: RebuildEveryToken,
    Fault.UNSAFE_MASKED_SLOTS: UnsafeMaskedSlots,
    Fault.STALE_ROPE: StaleRope,
    Fault.SHARED_BATCH_POSITION: SharedBatchPosition,
    Fault.STALE_PADDING_ROW: StalePaddingRow,
    Fault.REBUILD_ON_JOIN: RebuildOnJoin,
    Fault.PACKED_PREFILL_CROSS_ROWS: PackedPrefillCrossRows,
    Fault.NAIVE_DCE: lambda: FaultyPasses(Fault.NAIVE_DCE),
    Fault.SPLIT_PARTS_INTERLEAVED: lambda: FaultyPasses(Fault.SPLIT_PARTS_INTERLEAVED),
    Fault.AOT_CONSTANTS_MISBOUND: AotConstantsMisbound,
    Fault.PLAN_CACHE_IGNORES_WEIGHTS: PlanCacheIgnoresWeights,
}


def policy_for(fault: Fault) -> PlanPolicy:
    """A new plan policy that injects ``fault`` (the correct one for a fault that is not a plan policy)."""
    make = POLICIES.get(fault)
    return make() if make is not None else DEFAULT_POLICY
