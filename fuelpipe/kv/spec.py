"""KvSpec: which registered KV layout a run uses and its options, and the one place caches are made from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fuelpipe.errors import ConfigError
from fuelpipe.kv.layout import KV_LAYOUTS, KvLayout, layout_named


@dataclass(frozen=True)
class KvSpec:
    layout: str = "contiguous"  # a registered layout (fuelpipe.kv.layout): contiguous, paged, latent, ring, ...
    block_size: int = 16  # paged only
    num_blocks: Optional[int] = None  # paged only; None: exactly enough for one request (+ the null block)

    def __post_init__(self) -> None:
        if self.layout not in KV_LAYOUTS:
            layout_named(self.layout)  # raises, naming the layouts there are
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"kv.block_size must be an int >= 1, got {self.block_size!r}")

    @property
    def strategy(self) -> KvLayout:
        return layout_named(self.layout)

    def blocks_for(self, max_seq_len: int) -> int:
        """Block-table capacity for ``max_seq_len`` positions."""
        return -(-max_seq_len // self.block_size)

    def _check_serves(self, ctx) -> KvLayout:
        layout = self.strategy
        layout.check_serves(ctx.model)
        return layout

    def new_cache(self, ctx, max_seq_len: int):
        """A cache of this layout for ``ctx``'s model, able to hold ``max_seq_len`` positions."""
        return self._check_serves(ctx).new_cache(ctx, self, max_seq_len)

    def new_batch(self, ctx, max_batch: int, max_seq_len: int):
        """A batch cache of this layout: ``max_batch`` sequences of up to ``max_seq_len`` positions each."""
        return self._check_serves(ctx).new_batch(ctx, self, max_batch, max_seq_len)
