"""BatchSpec: how many sequences decode together, and the batch sizes a plan is built for.

A plan is built per bucket and held (the way CUDA-graph servers pre-capture
batch sizes): a step with n live rows runs the smallest bucket >= n, its
spare rows padding. Sequences joining or leaving inside a bucket change only
per-token data.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

from fuelpipe.errors import ConfigError

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class BatchSpec:
    max_batch: int = 8  # sequences decoded at once (the cache's slots / rows)
    buckets: tuple[int, ...] = ()  # () : the powers of two up to max_batch, and max_batch itself

    def __post_init__(self) -> None:
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, numbers.Integral) or self.max_batch < 1:
            raise ConfigError(f"batch.max_batch must be an integer >= 1, got {self.max_batch!r}")
        buckets = tuple(self.buckets)
        bad = [b for b in buckets if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1]
        if bad:
            raise ConfigError(f"batch.buckets must be integers >= 1, got {bad} in {list(buckets)}")
        if len(set(buckets)) != len(buckets):
            raise ConfigError(f"batch.buckets must not repeat a size, got {list(buckets)}")
        if buckets and max(buckets) < self.max_batch:
            raise ConfigError(
                f"batch.buckets {sorted(buckets)} cannot serve batch.max_batch={self.max_batch}: the largest bucket "
                f"must be >= max_batch (a full batch needs a plan)"
            )
        if not buckets:
            buckets = tuple(b for b in DEFAULT_BUCKETS if b < self.max_batch) + (self.max_batch,)
        object.__setattr__(self, "max_batch", int(self.max_batch))
        object.__setattr__(self, "buckets", tuple(sorted(int(b) for b in buckets)))

    @classmethod
    def of(cls, max_batch: int, buckets: Optional[Sequence[int]] = None) -> "BatchSpec":
        return cls(max_batch, tuple(buckets or ()))

    def bucket_for(self, n: int) -> int:
        """The smallest bucket holding ``n`` rows."""
        if not 1 <= n <= self.max_batch:
            raise ConfigError(f"a batch step serves 1..batch.max_batch={self.max_batch} rows, got {n}")
        return next(b for b in self.buckets if b >= n)
