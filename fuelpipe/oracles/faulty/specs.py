"""PLAN_CACHE_IGNORES_WEIGHTS and AOT_CONSTANTS_MISBOUND: backend settings whose hooks answer wrong.

``PlanCacheSpec.filed_key`` and ``BackendSpec.bound_weights`` answer correctly in
production; the frozen subclasses here override one each, and a negative control's
policy recasts the build's spec as one of them (``recast``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TypeVar

import torch

from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.plan_cache_key import PlanContentKey
from fuelpipe.plan.plan_store import PlanCacheSpec

S = TypeVar("S")


@dataclass(frozen=True)
class PlanCacheIgnoringWeights(PlanCacheSpec):
    """Files a plan without its weight digest: a plan compiled (weights baked) for one checkpoint is served to
    another of the same shapes."""

    def filed_key(self, key: PlanContentKey) -> PlanContentKey:
        return replace(key, weights="")


@dataclass(frozen=True)
class MisboundAot(BackendSpec):
    """Binds each weight of an ahead-of-time program to the next weight of its shape (layer i runs on layer
    i+1's matrix): the class of a name mismatch between the exported program and the package."""

    def bound_weights(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        return rotated_same_shape(weights)


def rotated_same_shape(ws: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor replaced by the next one of the same shape and dtype (a rotation within each group)."""
    by_shape: dict[tuple, list[int]] = {}
    for k, t in enumerate(ws):
        by_shape.setdefault((tuple(t.shape), t.dtype), []).append(k)
    out = list(ws)
    for ks in by_shape.values():
        for j, k in enumerate(ks):
            out[k] = ws[ks[(j + 1) % len(ks)]]
    return out


def recast(cls: type[S], spec) -> S:
    """``spec``'s settings as an instance of ``cls`` (a faulty subclass of its class)."""
    return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)})
