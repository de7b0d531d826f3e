"""The KV cache a ``TextModel`` keeps between generations, so that its held plan is reused, not rebuilt.

A plan is welded to its KV allocation and geometry (the plan-validity key), so a fresh cache sized to
each request would cost a plan build per call (0.5 s on SmolLM2, a third of a short chat). The shelf
keeps the last cache instead, sized in powers of two (at least ``MIN_POSITIONS``, at most the model's
positions), and rewinds it for the next generation; the plan on it stays valid. A cache is taken off the
shelf for one generation and put back when that generation ends, so two interleaved streams never share
one: the second gets its own.
"""
from __future__ import annotations

from typing import Iterator, Optional

from fuelpipe.context import InferenceContext

MIN_POSITIONS = 512


class CacheShelf:
    def __init__(self, context: InferenceContext) -> None:
        self.context = context
        self.kept = None  # the idle cache, or None
        self.made = 0  # caches allocated (a test and a report read it)

    def take(self, need: int):
        """An empty cache with room for ``need`` positions: the kept one when it is large enough. None when
        ``need`` is past the model's positions: ``generate_iter`` then refuses the request in its own words."""
        limit = self.context.model.dims.max_position_embeddings
        if limit and need > limit:
            return None
        cache, self.kept = self.kept, None
        if cache is not None and cache.max_seq_len >= need:
            cache.truncate_to(0)  # positions past the length are masked until overwritten
            return cache
        self.made += 1
        return self.context.new_cache(positions_for(need, limit))

    def put(self, cache) -> None:
        """A generation ended: keep its cache unless a larger one is kept already."""
        if cache is None:
            return
        if self.kept is None or cache.max_seq_len > self.kept.max_seq_len:
            self.kept = cache

    def lend(self, tokens: Iterator[int], cache) -> Iterator[int]:
        """``tokens`` (a generation on ``cache``), putting ``cache`` back when it ends or is closed."""
        try:
            yield from tokens
        finally:
            self.put(cache)


def positions_for(need: int, limit: Optional[int]) -> int:
    """The power of two >= ``need`` (>= MIN_POSITIONS), capped at the model's ``limit`` (never below need)."""
    size = MIN_POSITIONS
    while size < need:
        size *= 2
    return max(need, min(size, limit)) if limit else size
