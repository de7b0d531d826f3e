"""How a batch oracle compares one served request with its solo run, greedy or seeded sampled.

* Greedy: the same tokens as the solo run, and logits within the tolerance (scaled by the logit size).
* Seeded sampled: a fresh generator seeded with the request's own seed, drawing over the request's
  own batch logits rows, must pick exactly the tokens the batch drew (no float tolerance involved:
  the rows are the batch's own); those rows must match a solo run teacher-forced on the same tokens
  within the tolerance; and requests with the same prompt and sampling must draw the same tokens.
  A generator shared by requests, reseeded every step, or seeded from the row fails the replay.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from fuelpipe.batch.scheduler import RequestResult
from fuelpipe.oracles.base import compare_scaled
from fuelpipe.sampling import draw


@dataclass
class Tally:
    """Problems found and logit errors measured over every comparison of one oracle run."""

    tolerance: float
    problems: list[str] = field(default_factory=list)
    worst: float = 0.0
    allowed: float = 0.0
    compared: int = 0  # logits rows compared

    def served(self, res: RequestResult, tag: str = "") -> bool:
        if res.finish in ("length", "stop"):
            return True
        self.problems.append(f"{tag}{res.request.name} ended {res.finish!r}: {res.error}")
        return False

    def logits(self, label: str, want: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> None:
        n = min(len(want), len(got))
        err, step, _, allowed = compare_scaled(want[:n], got[:n], self.tolerance)
        self.worst, self.allowed, self.compared = max(self.worst, err), max(self.allowed, allowed), self.compared + n
        if step is not None:
            self.problems.append(f"{label}: logits differ from solo by {err:.3g} > {allowed:.3g} from token {step}")

    def greedy(self, res: RequestResult, tokens: list[int], logits: Sequence[torch.Tensor], tag: str = "") -> None:
        """``res`` against its solo run's first ``len(res.tokens)`` tokens (a shorter budget is a prefix)."""
        name = f"{tag}{res.request.name}"
        if not self.served(res, tag):
            return
        want = tokens[: len(res.tokens)]
        if res.tokens != want:
            first = next((i for i, (a, c) in enumerate(zip(res.tokens, want)) if a != c), min(len(res.tokens),
                                                                                              len(want)))
            self.problems.append(f"{name}: greedy tokens differ from its solo run at token {first} "
                                 f"(batch {res.tokens[first:first + 3]} vs solo {want[first:first + 3]})")
        self.logits(name, logits, res.logits)

    def detail(self) -> str:
        more = f" (+{len(self.problems) - 4} more)" if len(self.problems) > 4 else ""
        return "; ".join(self.problems[:4]) + more


def replay_mismatch(res: RequestResult) -> Optional[int]:
    """The first token a fresh generator with the request's own seed draws otherwise over the request's own
    logits rows; None when it draws every token the batch drew."""
    s = res.request.sampling
    gen = torch.Generator().manual_seed(s.seed)
    for i, (row, token) in enumerate(zip(res.logits, res.tokens)):
        if draw(row[None], s.temperature, s.top_k, gen) != token:
            return i
    return None


def check_sampled(results: Sequence[RequestResult], forced: Sequence[Sequence[torch.Tensor]], tally: Tally) -> int:
    """Seeded sampled results against their own seeds, their teacher-forced solo rows and each other;
    returns how many distinct token streams they drew."""
    twins: dict[tuple, list[RequestResult]] = defaultdict(list)
    for res, rows in zip(results, forced):
        if not tally.served(res):
            continue
        name = res.request.name
        bad = replay_mismatch(res)
        if bad is not None:
            tally.problems.append(f"{name}: a fresh sampler with its own seed {res.request.sampling.seed} draws "
                                  f"another token at {bad} over the request's own logits (batch drew "
                                  f"{res.tokens[bad:bad + 3]}): its random stream is not its own")
        tally.logits(name, rows, res.logits)
        r = res.request
        twins[(r.prompt_ids, r.sampling, r.max_new_tokens)].append(res)
    for group in twins.values():
        streams = {tuple(res.tokens) for res in group}
        if len(streams) > 1:
            names = [res.request.name for res in group]
            tally.problems.append(f"{names} share prompt and seed but drew different tokens "
                                  f"({[res.tokens[:4] for res in group]})")
    spans = [(r.admitted_step, r.finished_step) for r in results if r.admitted_step is not None
             and r.finished_step is not None]  # batched steps [joined, left)
    together = max((sum(start <= when < end for start, end in spans) for when, _ in spans), default=0)
    if together < 2:
        tally.problems.append(f"no two seeded sampled requests were live at once ({len(results)} of them): "
                              "nothing about per-request random streams was checked")
    return len({tuple(res.tokens) for res in results})
