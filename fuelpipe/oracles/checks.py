"""A list of named checks, each a pass/fail with what was seen: what the scenario oracles report.

``cache_lifecycle`` and ``rebind_guard`` run several scenarios each; every
scenario adds checks here (logit rows compared bit-exactly, plan accounting,
refusals), and the oracle passes only when every check did.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from fuelpipe.backbone import OFFSET_MODES
from fuelpipe.kv.layout import signature_for
from fuelpipe.oracles.base import OracleInput, OracleResult, compare


@dataclass
class Check:
    """One named check of a scenario oracle: passed or not, what was seen, and the logit error it measured."""

    name: str
    ok: bool
    seen: str
    error: float = 0.0


@dataclass
class Checks:
    """Named checks in the order they ran; ``worst`` is the largest logit error seen."""

    items: list[tuple[str, bool, str]] = field(default_factory=list)
    worst: float = 0.0

    def add(self, name: str, ok: bool, seen: str) -> bool:
        self.items.append((name, bool(ok), seen))
        return bool(ok)

    def rows(self, name: str, want: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> bool:
        """torch.equal of every row; records the first divergent row when there is one."""
        worst, first = compare(want, got)
        self.worst = max(self.worst, worst)
        seen = f"{len(got)} rows torch.equal" if first is None else f"row {first} of {len(got)} differs (max abs {worst:g})"
        return self.add(name, first is None, seen)

    @property
    def failed(self) -> list[str]:
        return [f"{name} ({seen})" for name, ok, seen in self.items if not ok]

    def result(self, name: str, ran: str) -> OracleResult:
        failed = self.failed
        return OracleResult(
            name=name,
            passed=not failed,
            metric={"checks": len(self.items), "failed_checks": len(failed), "max_abs_error": self.worst},
            tolerance=0.0,
            detail=f"{ran}; failed: " + "; ".join(failed) if failed else f"{ran}; all {len(self.items)} checks passed",
        )


def decode_rows(ctx, cache, prompt: Optional[Sequence[int]], tokens: Sequence[int]) -> list[torch.Tensor]:
    """Logit rows [vocab]: the prefill's (when ``prompt`` is given), then one per decoded token."""
    rows = [] if prompt is None else [ctx.prefill(cache, list(prompt))[0]]
    return rows + [ctx.decode(cache, t)[0] for t in tokens]


def forced_tokens(vocab: int, n: int, seed: int) -> list[int]:
    """Teacher-forced decode tokens: random (so a tiny model's repetitive argmax hides nothing), fixed by ``seed``."""
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def accounting(stats) -> str:
    validity = "none" if stats.last_validity is None else stats.last_validity.value
    return f"builds={stats.builds} rebinds={stats.rebinds} refusals={len(stats.refusals)} validity={validity}"


def offset_paths(inp: OracleInput, probe) -> list[tuple[str, str]]:
    """(offset mode, step kind) pairs to run on ``probe``'s cache layout: the setup's own path, or, when it
    names none, the model's own first and then every other mode that gives the layout another step kind."""
    if inp.setup.offset_mode is not None:
        modes = [inp.setup.offset_mode]
    else:
        modes = [inp.model.offset_mode] + [m for m in OFFSET_MODES if m != inp.model.offset_mode]
    kinds: dict[str, str] = {}
    for mode in modes:  # a latent cache has one step whatever the offset mode: run it once
        kinds.setdefault(signature_for(probe, mode).name, mode)
    return [(mode, kind) for kind, mode in kinds.items()]
