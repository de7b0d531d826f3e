"""Match a checkpoint's tensors to a meta model's parameters before any data is read.

Every checkpoint tensor must map onto a parameter and every parameter must be
loaded; a tied parameter (a head sharing the embedding) is one target with
several state-dict names. Refusals name the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from fuelpipe.weights.errors import MissingTensorError, TensorShapeError, UnexpectedTensorError


def param_groups(model: torch.nn.Module, only_meta: bool = False) -> dict[str, list[str]]:
    """Canonical name -> every state-dict name sharing that tensor (a tied head shares the embedding).

    ``only_meta``: only tensors still without data (the rest of a model whose matrices were packed)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if not only_meta or p.is_meta:
            groups.setdefault(id(p), []).append(name)
    for name, b in model.named_buffers(remove_duplicate=False):
        if b is not None and (not only_meta or b.is_meta):
            groups.setdefault(id(b), []).append(name)
    return {names[0]: names for names in groups.values()}


@dataclass(frozen=True)
class PlannedTensor:
    source: str  # checkpoint tensor name
    target: str  # canonical parameter name
    transform: Optional[Callable]


def plan_tensors(
    path: Path, model: torch.nn.Module, sources: Iterable[str], resolve: Callable[[str], Optional[tuple[str, Any]]],
    expected_source: Callable[[str], str], what: str,
) -> list[PlannedTensor]:
    """Match checkpoint tensors to parameters; refuse unknown tensors and missing parameters by name."""
    groups = param_groups(model)
    canonical = {name: canon for canon, names in groups.items() for name in names}
    planned: dict[str, list[PlannedTensor]] = {}
    for src in sources:
        hit = resolve(src)
        if hit is None or hit[0] not in canonical:
            raise UnexpectedTensorError(path, f"tensor {src!r} has no counterpart in the {what} built from this "
                                              "checkpoint's config")
        target, transform = hit
        planned.setdefault(canonical[target], []).append(PlannedTensor(src, canonical[target], transform))
    missing = [c for c in groups if c not in planned]
    if missing:
        names = ", ".join(f"{expected_source(m)!r} (for {m})" for m in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise MissingTensorError(path, f"missing tensor {names}{more}")
    return [p for group in planned.values() for p in group]


def check_shape(path: Path, src: str, got: tuple[int, ...], want: tuple[int, ...], target: str) -> None:
    if tuple(got) != tuple(want):
        raise TensorShapeError(path, f"tensor {src!r} has shape {list(got)}, but {target} needs {list(want)}")
