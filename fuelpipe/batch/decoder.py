"""BatchDecoder: one token for each of up to ``max_batch`` sequences in one batched step.

The rows of a step are the live sequences (any lengths: ragged) followed by
padding rows up to the bucket size. Each bucket has its own held plan (the
shared driver's ``HeldPlan``, keyed with the bucket in its geometry), so a
sequence joining or leaving inside a bucket rebinds per-token data only,
and a step in another bucket switches to (or builds) that bucket's plan.

Per-token data of a step, per row: token id, position, RoPE rows, mask rows
(each row its own causal limit and sliding window), write offset, and its
slot id (batch-slot caches) or block-table row (paged). A padding row sits at
position 0 of the null slot / null block: it writes nothing a sequence owns
and attends only what it wrote.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx

from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.batch.packed_prefill import packed_prefill
from fuelpipe.context import InferenceContext
from fuelpipe.token_ids import token_int
from fuelpipe.driver import HeldPlan
from fuelpipe.errors import InputError
from fuelpipe.kv.batch import BucketView
from fuelpipe.masks import row_mask_variants
from fuelpipe.plan.derived_weights import owned_bytes
from fuelpipe.plan.token_data import TokenHostData


class BatchDecoder:
    def __init__(self, ctx: InferenceContext, kv, spec: BatchSpec | int | None = None) -> None:
        ctx.check_batch_cache(kv)
        spec = BatchSpec(kv.max_rows) if spec is None else spec
        spec = BatchSpec(spec) if isinstance(spec, int) else spec
        if spec.max_batch > kv.max_rows:
            raise InputError(f"BatchDecoder: batch.max_batch={spec.max_batch} exceeds the cache's {kv.max_rows} rows")
        self.ctx, self.kv, self.spec = ctx, kv, spec
        self.policy = ctx.plan.policy
        self.plans: dict[int, HeldPlan] = {}  # bucket -> its held plan
        self.steps = 0
        self.rows_served = 0  # live rows over all steps (padding excluded)

    # ---- accounting ----------------------------------------------------------------------
    @property
    def builds(self) -> int:
        return sum(p.stats.builds for p in self.plans.values())

    @property
    def rebinds(self) -> int:
        return sum(p.stats.rebinds for p in self.plans.values())

    def plans_held(self) -> dict[int, int]:
        """bucket -> bytes of the held plan's own input buffers (weights and KV are shared, not counted)."""
        return {b: p.session.buffers.nbytes() for b, p in sorted(self.plans.items()) if p.session is not None}

    def plan_weight_bytes(self) -> int:
        """Bytes of weight copies the held plans own (fused, transposed), each shared copy counted once."""
        model = self.ctx.model
        own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        held: list[torch.Tensor] = []
        for plan in self.plans.values():
            if plan.session is not None:
                gm = getattr(plan.session.program.fn, "_orig_mod", plan.session.program.fn)
                if isinstance(gm, torch.fx.GraphModule):
                    held += [*gm.parameters(), *gm.buffers()]
        return sum(owned_bytes(held, own).values())

    def describe(self) -> dict:
        held = self.plans_held()
        return {"buckets": list(self.spec.buckets), "max_batch": self.spec.max_batch,
                "builds": self.builds, "rebinds": self.rebinds,
                "builds_per_bucket": {b: p.stats.builds for b, p in sorted(self.plans.items())},
                "plans_held": len(held), "plan_buffer_bytes": sum(held.values()),
                "plan_weight_bytes": self.plan_weight_bytes(),
                "steps": self.steps, "rows_served": self.rows_served}

    # ---- one step ------------------------------------------------------------------------
    def _checked(self, rows: Sequence, tokens: Sequence) -> tuple[list, list[int]]:
        self.ctx.check_batch_cache(self.kv)  # the context may serve another model since (switch_model)
        rows, n = list(rows), len(rows)
        if not 1 <= n <= self.spec.max_batch:
            raise InputError(f"a batch step serves 1..batch.max_batch={self.spec.max_batch} rows, got {n}")
        if len(tokens) != n:
            raise InputError(f"a batch step needs one token per row: {n} rows, {len(tokens)} tokens")
        if len({id(r) for r in rows}) != n:
            raise InputError("a batch step lists a sequence twice; each row must be a different sequence")
        for i, row in enumerate(rows):
            if not self.kv.owns(row):
                raise InputError(f"batch row {i} is not a live sequence of this batch cache "
                                 "(acquire it from the cache; a released one is gone)")
        vocab = self.ctx.model.dims.vocab_size
        ids = [token_int(t) for t in tokens]
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocab]
        if bad:
            raise InputError(f"token ids must lie in [0, {vocab}), got (row, id) {bad[:8]}")
        limit = self.ctx.model.dims.max_position_embeddings
        for i, row in enumerate(rows):
            if row.cached_len + 1 > limit:
                raise InputError(f"batch row {i} at position {row.cached_len} is past the model's "
                                 f"max_position_embeddings {limit}")
        for row in rows:
            row.check_room(row.cached_len, 1)  # a paged row grows into a new block here, atomically
        return rows, ids

    def _host(self, rows: list, ids: list[int], bucket: int) -> TokenHostData:
        pad = bucket - len(rows)
        padded = rows + [None] * pad
        positions = torch.tensor([r.cached_len for r in rows] + [0] * pad, dtype=torch.int64)  # [B]
        seen = self.policy.batch_positions(positions)  # where each row's queries look from
        cos, sin = self.ctx.rope_tables()  # [n_specs, P, rot]
        where = self.policy.row_data(self.kv, padded, positions, self.kv.row_indices(padded, positions))
        top = int(positions.max()) + 1
        return TokenHostData(
            token_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64)[:, None],  # [B, 1]
            rope_cos=cos[:, seen][:, :, None],  # [n_specs, B, 1, rot]
            rope_sin=sin[:, seen][:, :, None],
            mask=row_mask_variants(self.ctx.model.mask_plan, seen, self.kv.width, self.ctx.dtype),  # [V, B, 1, 1, S]
            write_index=where["write_index"],
            cached_len=top - 1,
            attended_len=top,
            block_table=where.get("block_table"),
            slot_ids=where.get("slot_ids"),
        )

    @torch.no_grad()
    def step(self, rows: Sequence, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens[i]`` to sequence ``rows[i]``; returns each row's next-token logits [n, vocab] f32."""
        rows, ids = self._checked(rows, tokens)
        bucket = self.spec.bucket_for(len(rows))
        host = self._host(rows, ids, bucket)
        plan = self.plans.get(bucket)
        if plan is None:
            c = self.ctx
            plan = self.plans[bucket] = HeldPlan(c.plan.spec, c.plan.mode, c.offset_mode, c.plan.policy)
        extra = self.policy.bucket_key(rows)
        logits = plan.step(self.ctx.model, BucketView(self.kv, bucket, extra), host)
        for row in rows:
            row.advance(1)
            row.bump_all_versions()
        self.steps += 1
        self.rows_served += len(rows)
        return logits[: len(rows)]

    def prefill(self, rows: Sequence, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prefill the fresh sequences ``rows`` with ``prompts`` in one packed step
        (``fuelpipe.batch.packed_prefill``); returns each one's next-token logits [n, vocab] f32."""
        return packed_prefill(self.ctx, self.kv, rows, prompts)

    def drop(self) -> None:
        """Drop every held plan (for example after an in-place ``param.data.copy_`` the identity cannot see)."""
        for plan in self.plans.values():
            plan.drop()

