"""What every oracle receives and returns, and the token-stream helpers they share."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.context import InferenceContext
from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.spec import KvSpec
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.sampling import greedy


@dataclass(frozen=True)
class Setup:
    """How a context is made: backend, plan mode and offset path (None: the model's own)."""

    backend: BackendSpec
    plan: PlanMode
    offset_mode: Optional[str] = None
    kv: KvSpec = KvSpec()

    def context(self, model: DecodeBackbone, *, plan: Optional[PlanMode] = None, fault: Fault = Fault.NONE):
        return InferenceContext(
            model, self.backend, plan or self.plan, offset_mode=self.offset_mode, policy=policy_for(fault)
        )

    def with_changes(self, **changes: Any) -> "Setup":
        return dataclasses.replace(self, **changes)

    def with_backend(self, name: str) -> "Setup":
        return self.with_changes(backend=dataclasses.replace(self.backend, name=name))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend.name, "plan": self.plan.value, "offset_mode": self.offset_mode,
                "kv": self.kv.layout}


@dataclass(frozen=True)
class OracleInput:
    model: DecodeBackbone
    setup: Setup
    prompts: tuple[tuple[int, ...], ...]
    new_tokens: int  # generated tokens per run: one from the prefill, the rest decoded
    max_seq_len: int  # every cache an oracle allocates has this capacity (it is part of the plan key)
    other_model: Callable[[], DecodeBackbone]  # same config, different weights
    tolerance: Optional[float] = None  # max abs error, for tolerance oracles
    fault: Fault = Fault.NONE  # set only by a negative control
    batch: BatchSpec = BatchSpec()  # the batch oracles' max_batch and buckets (config: batch.*)
    # The same checkpoint with its matrices as built (f32), for a quantized model; None otherwise.
    dense_model: Optional[Callable[[], DecodeBackbone]] = None

    def cache(self, ctx: InferenceContext):
        return self.setup.kv.new_cache(ctx, self.max_seq_len)


@dataclass
class OracleResult:
    name: str
    passed: bool
    metric: dict[str, Any]
    tolerance: Optional[float]  # 0.0 for bit-exact, None for counting oracles
    detail: str
    negative_control: bool = False
    fault: str = Fault.NONE.value
    seconds: float = 0.0
    builds: int = 0  # programs built while the oracle ran (plans, batch plans, prompt programs)
    build_s: float = 0.0  # and the seconds those builds took
    setup: dict[str, Any] = field(default_factory=dict)
    # Nothing was checked (for example transformers is not installed); ``detail`` says why. A skipped
    # result is never a pass (``passed`` is False) and never a failure (it does not fail the run).
    skipped: bool = False

    def __post_init__(self) -> None:
        if self.skipped and self.passed:
            raise ValueError(f"oracle {self.name}: a skipped result cannot also be passed")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def skipped(name: str, reason: str, tolerance: Optional[float] = None) -> OracleResult:
    """The result of an oracle that could not check anything here, with the reason."""
    return OracleResult(name, False, {}, tolerance, f"skipped: {reason}", skipped=True)


def forced_logits(
    ctx: InferenceContext, cache: ContiguousKvCache, prompt: Sequence[int], tokens: Sequence[int]
) -> list[torch.Tensor]:
    """Logits [vocab] for each of ``tokens``' positions with the stream forced to ``tokens``.

    Row 0 comes from the prefill; row i from decoding ``tokens[i-1]``. Both arms
    of a comparison then see identical inputs, so one divergence cannot
    cascade into a different token stream.
    """
    rows = [ctx.prefill(cache, list(prompt))[0]]
    for token in tokens[:-1]:
        rows.append(ctx.decode(cache, token)[0])
    return rows


def greedy_run(ctx: InferenceContext, cache: ContiguousKvCache, prompt: Sequence[int], n: int):
    """(tokens, logits rows) of a greedy generation of ``n`` tokens."""
    result = ctx.generate(list(prompt), n, sampler=greedy, cache=cache, keep_logits=True)
    return result.tokens, result.logits


def compare_scaled(
    want: Sequence[torch.Tensor], got: Sequence[torch.Tensor], tolerance: float
) -> tuple[float, Optional[int], float, float]:
    """(max abs error, first divergent step, logit scale, allowed) against a reference within ``tolerance``.

    The tolerance is absolute for logits up to 1 and scales with the largest reference logit beyond
    that (float accumulation error grows with the values summed).
    """
    scale = max(1.0, max(float(row.abs().max()) for row in want))
    allowed = tolerance * scale
    worst, first = compare(want, got, atol=allowed)
    return worst, first, scale, allowed


def compare(
    want: Sequence[torch.Tensor], got: Sequence[torch.Tensor], atol: Optional[float] = None
) -> tuple[float, Optional[int]]:
    """(max abs error, first divergent step). Bit-exact (torch.equal) when ``atol`` is None."""
    if len(want) != len(got):
        raise ValueError(f"compare: {len(want)} expected rows against {len(got)} observed")
    worst, first = 0.0, None
    for step, (a, b) in enumerate(zip(want, got)):
        err = float((a.float() - b.float()).abs().max())
        err = float("inf") if math.isnan(err) else err  # NaN never compares: record it as the worst
        worst = max(worst, err)
        bad = not torch.equal(a, b) if atol is None else err > atol
        if bad and first is None:
            first = step
    return worst, first
