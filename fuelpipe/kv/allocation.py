"""What every KV allocation shows a plan about itself: its never-recycled id and where it provably lives."""
from __future__ import annotations

from typing import Optional

import torch

from fuelpipe.identity import KvAllocId


class Allocation:
    """Mixin of the caches that own buffers: ``_alloc_id`` (re-minted when the storage is replaced) and
    ``_device_location`` (None means "cannot prove", which a rebind treats as a refusal, never as CPU)."""

    _alloc_id: KvAllocId
    _device_location: Optional[torch.device]

    @property
    def alloc_id(self) -> KvAllocId:
        return self._alloc_id

    @property
    def device_location(self) -> Optional[torch.device]:
        return self._device_location

    def recycle(self):
        """Ready for the next request: ``clear()`` (fresh storage, so a new alloc_id), and this cache serves it.
        A sequence whose storage outlives it (a block pool's) answers with a new sequence instead."""
        self.clear()
        return self
