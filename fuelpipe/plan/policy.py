"""PlanPolicy: the seams through which a held plan is keyed, built, reused and fed.

Every hook's default is the correct behaviour, and production code only ever
uses ``PlanPolicy()``. The seams exist so a test or an oracle can install
another strategy for one context (``InferenceContext(..., policy=...)``): the
oracles' negative controls subclass this in ``fuelpipe.oracles.faulty`` to
break one rule and show that their oracle notices.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.kv.layout import StepSignature
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.session import DecodeSession
from fuelpipe.plan.validity import PlanKey
from fuelpipe.step import step_module_for


class PlanPolicy:
    """The correct strategy for every seam; subclass and override one hook to change one rule."""

    session_class: type[DecodeSession] = DecodeSession  # the held plan's session (how it runs and rebinds)

    # ---- single-sequence plans (fuelpipe.driver) ------------------------------------------
    def key(self, key: PlanKey) -> PlanKey:
        """The key a plan is built for and checked against, given the live one."""
        return key

    def reuses_plans(self) -> bool:
        """Whether a held plan may serve the next token at all (plan_once's reuse)."""
        return True

    def backend(self, spec: BackendSpec) -> BackendSpec:
        """The backend settings one build runs with (passes already chosen for its rows)."""
        return spec

    def step_module(self, backbone: DecodeBackbone, signature: StepSignature) -> nn.Module:
        """The step module a build traces."""
        return step_module_for(backbone, signature)

    # ---- RoPE tables (fuelpipe.context) ---------------------------------------------------
    def tables_kept_on_rope_change(
        self, tables: Optional[tuple[torch.Tensor, torch.Tensor]]
    ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The RoPE tables a context keeps after ``set_rope_plan``: none (the next use recomputes them)."""
        return None

    # ---- batches (fuelpipe.batch) ---------------------------------------------------------
    def batch_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """[B] the position each batch row's queries look from (RoPE rows and mask): its own."""
        return positions

    def row_data(self, kv, rows: list, positions: torch.Tensor, where: dict) -> dict:
        """A batch step's per-row KV data (``kv.row_indices``: slots or block tables, write offsets) as the
        step uses it; ``rows`` holds None for a padding row. As the cache gave it."""
        return where

    def bucket_key(self, rows: list) -> tuple:
        """Extra fields for a batch plan's key beyond the bucket's geometry: none (joins and leaves rebind)."""
        return ()

    def packed_segment(self, segment: torch.Tensor) -> torch.Tensor:
        """[N] which prompt each packed token belongs to (its mask keeps prompts apart)."""
        return segment


DEFAULT_POLICY = PlanPolicy()
