"""KvSpec: which KV strategy a run uses and its geometry, and the one place caches are made from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fuelpipe.errors import ConfigError

LAYOUTS = ("contiguous", "paged", "latent")


@dataclass(frozen=True)
class KvSpec:
    layout: str = "contiguous"
    block_size: int = 16  # paged only
    num_blocks: Optional[int] = None  # paged only; None: exactly enough for one request (+ the null block)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"kv layout must be one of {list(LAYOUTS)}, got {self.layout!r}")
        if self.block_size < 1:
            raise ConfigError(f"kv.block_size must be >= 1, got {self.block_size}")

    def blocks_for(self, max_seq_len: int) -> int:
        """Block-table capacity for ``max_seq_len`` positions."""
        return -(-max_seq_len // self.block_size)

    def _check_serves(self, ctx) -> None:
        is_mla = ctx.model.latent_slots is not None
        if is_mla != (self.layout == "latent"):
            raise ConfigError(
                f"kv={self.layout} cannot serve {ctx.model.family}: "
                + ("MLA families decode from kv=latent" if is_mla else "kv=latent is for MLA families only")
            )

    def new_cache(self, ctx, max_seq_len: int):
        """A cache of this layout for ``ctx``'s model, able to hold ``max_seq_len`` positions.

        Paged: a pool of its own per request (so requests are separate allocations), unless
        ``num_blocks`` is set, in which case that many blocks are allocated for it.
        """
        self._check_serves(ctx)
        if self.layout == "paged":
            cap = self.blocks_for(max_seq_len)
            pool = ctx.new_pool(self.num_blocks or cap + 1, self.block_size)
            return pool.sequence(cap)
        return ctx.new_cache(max_seq_len)

    def new_batch(self, ctx, max_batch: int, max_seq_len: int):
        """A batch cache of this layout: ``max_batch`` sequences of up to ``max_seq_len`` positions each.

        Contiguous / latent: one batch-slot allocation. Paged: one pool shared by the rows, of
        ``num_blocks`` blocks when set, else enough for every row at full length (+ the null block).
        """
        self._check_serves(ctx)
        if self.layout == "paged":
            cap = self.blocks_for(max_seq_len)
            pool = ctx.new_pool(self.num_blocks or max_batch * cap + 1, self.block_size)
            return ctx.new_paged_batch(pool, max_batch, cap)
        return ctx.new_batch_cache(max_batch, max_seq_len)
