"""Latent KV cache: N slots per layer, each [max_seq_len, *trailing], capacity on dim 0.

For multi-head latent attention (DeepSeek-V2) slot 0 holds the compressed,
normalised KV latent [S, kv_lora_rank] and slot 1 the single-head RoPE key
[S, qk_rope_head_dim]. Identity rules match the contiguous cache: replacing
storage or clearing re-mints ``alloc_id``; rewinding keeps it.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from fuelpipe.errors import KvCacheError, KvCapacityError, KvLayerError
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.allocation import Allocation, UpFrontSequence
from fuelpipe.kv.sizes import check_dtype, check_size


class LatentKvCache(UpFrontSequence, Allocation):
    kv_layout = "latent"  # fuelpipe.kv.latent_layout
    batched = False

    def __init__(
        self,
        n_layers: int,
        slot_trailing: Sequence[Sequence[int]],
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        n_layers = check_size("LatentKvCache", "n_layers", n_layers)
        max_seq_len = check_size("LatentKvCache", "max_seq_len", max_seq_len)
        dtype = check_dtype("LatentKvCache", dtype)
        if len(slot_trailing) < 1:
            raise KvCapacityError("LatentKvCache: at least one slot per layer is required, got 0")
        bad = [tuple(t) for t in slot_trailing if not all(int(d) >= 1 for d in t)]
        if bad:
            raise KvCapacityError(f"LatentKvCache: slot trailing dims must be >= 1, got {bad}")
        self.n_layers = n_layers
        self.slot_trailing = tuple(tuple(int(d) for d in t) for t in slot_trailing)
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.cached_len = 0
        self._device = torch.device(device)
        self._allocate()

    def _allocate(self) -> None:
        self.slots: list[list[torch.Tensor]] = [
            [torch.zeros((self.max_seq_len, *t), dtype=self.dtype, device=self._device) for t in self.slot_trailing]
            for _ in range(self.n_layers)
        ]
        self.versions = [[0] * len(self.slot_trailing) for _ in range(self.n_layers)]
        self._alloc_id = KvAllocId.mint()
        self._device_location: Optional[torch.device] = self.slots[0][0].device

    @property
    def n_slots(self) -> int:
        return len(self.slot_trailing)

    # ---- lifecycle ------------------------------------------------------------------------
    def slot(self, layer: int, slot: int) -> torch.Tensor:
        if not 0 <= layer < self.n_layers:
            raise KvLayerError(f"LatentKvCache: layer {layer} out of range [0, {self.n_layers})")
        if not 0 <= slot < self.n_slots:
            raise KvLayerError(f"LatentKvCache: slot {slot} out of range [0, {self.n_slots})")
        return self.slots[layer][slot]

    def set_slot(self, layer: int, slot: int, tensor: torch.Tensor) -> None:
        """Install caller storage: a new allocation whose residency cannot be proven."""
        self.slot(layer, slot)  # range checks
        want = (self.max_seq_len, *self.slot_trailing[slot])
        if tuple(tensor.shape) != want or tensor.dtype != self.dtype:
            raise KvLayerError(f"set_slot: slot {slot} must be {list(want)} of {self.dtype}, "
                               f"got {list(tensor.shape)} of {tensor.dtype}")
        self.slots[layer][slot] = tensor
        self._alloc_id = KvAllocId.mint()
        self._device_location = None

    def clear(self) -> None:
        self.cached_len = 0
        if self._device_location is not None:
            self._device = self._device_location
        self._allocate()

    def reset(self) -> None:
        for layer in self.slots:
            for t in layer:
                t.zero_()
        self.cached_len = 0

    def truncate_to(self, new_len: int) -> None:
        """Rewind to ``new_len`` positions (speculative rollback); keeps alloc_id and the slots.

        Only rewinds: a ``new_len`` past ``cached_len`` is refused (``KvCapacityError``) and
        nothing changes; positions from ``new_len`` on are masked until overwritten.
        """
        if isinstance(new_len, bool) or not isinstance(new_len, int):
            raise KvCacheError(f"truncate_to: new_len must be an int, got {type(new_len).__name__} {new_len!r}")
        if new_len < 0:
            raise KvCapacityError(f"truncate_to: new_len must be >= 0, got {new_len}")
        if new_len > self.cached_len:
            raise KvCapacityError(
                f"truncate_to: new_len must be <= cached_len {self.cached_len} (truncate only rewinds), got {new_len}"
            )
        self.cached_len = new_len

    def check_room(self, start: int, n: int) -> None:
        if start < 0 or n < 0 or start + n > self.max_seq_len:
            raise KvCapacityError(
                f"LatentKvCache: positions [{start}, {start + n}) exceed max_seq_len {self.max_seq_len}"
            )

    def bump_all_versions(self) -> None:
        for row in self.versions:
            for s in range(len(row)):
                row[s] += 1

    # ---- what a plan reads ----------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.max_seq_len

    def plan_geometry(self, seq: int) -> tuple:
        return (("seq", seq), ("max_seq_len", self.max_seq_len), ("slots", self.slot_trailing))

    def write_index(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, dtype=torch.int64)

    def block_table(self) -> None:
        return None

    def rebind_location(self) -> Optional[torch.device]:
        return self._device_location

    def rebind_slot(self, layer: int, which: int) -> Optional[torch.Tensor]:
        if not 0 <= layer < self.n_layers or not 0 <= which < self.n_slots:
            return None
        return self.slots[layer][which]

    def bound_tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.slots for t in layer]

    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_layer = sum(math.prod(t) for t in self.slot_trailing)
        return self.n_layers * per_layer * elem

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bound_tensors())
