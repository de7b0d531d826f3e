"""The batch-slot toolkit: slot numbers, and the base every slot-per-sequence batch cache shares.

A batch-slot cache holds ``n_slots + 1`` rows per bound tensor; slot 0 is the null slot, never
handed out, the only place a padding row may write. ``SlotBatchCache`` is the protocol the batch
decoder, the scheduler and packed prefill read (and its default answers): rows, identity,
residency, the rebind source, per-row step data, what a request needs beyond a row, and what the
batch oracles audit. A layout outside ``fuelpipe`` builds its batch cache on it (``kv/ring.py``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from fuelpipe.errors import KvCacheError, KvCapacityError
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.allocation import Allocation

NULL_SLOT = 0


class KvOutOfSlotsError(KvCapacityError):
    """Every slot of the batch cache is held; nothing was handed out."""


class SlotAllocator:
    """Hands out slot numbers 1..n_slots (0 is the null slot); lowest free first."""

    def __init__(self, n_slots: int, what: str) -> None:
        self.n_slots = n_slots
        self._what = what
        self._free = list(range(n_slots, NULL_SLOT, -1))
        self.held: dict[int, object] = {}  # slot -> its handle

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise KvOutOfSlotsError(f"{self._what}: all {self.n_slots} slots are held; release one first")
        self._free.sort(reverse=True)
        return self._free.pop()

    def give_back(self, slot: int, handle: object) -> None:
        if self.held.get(slot) is not handle:
            raise KvCacheError(f"{self._what}: slot {slot} is not held by this handle (already released?)")
        del self.held[slot]
        self._free.append(slot)


class SlotBatchCache(Allocation):
    """What the batch-slot caches share: slots, identity, residency, the rebind-source protocol."""

    kv_layout = ""
    batched = True
    _allocator: SlotAllocator
    _bound: list[torch.Tensor]

    def _init_identity(self) -> None:
        self._alloc_id = KvAllocId.mint()
        self._device_location: Optional[torch.device] = self._bound[0].device

    @property
    def max_rows(self) -> int:
        return self._allocator.n_slots

    @property
    def free_rows(self) -> int:
        return self._allocator.free_slots

    @property
    def width(self) -> int:
        return self.max_seq_len

    def slot_handle(self, slot: int):
        """A one-sequence cache over ``slot``'s views (each batch cache names its own kind)."""
        raise NotImplementedError

    def acquire(self):
        """The lowest free slot as a one-sequence cache over its views; ``KvOutOfSlotsError`` when none is free."""
        slot = self._allocator.take()
        handle = self.slot_handle(slot)
        self._allocator.held[slot] = handle
        return handle

    def owns(self, handle) -> bool:
        return getattr(handle, "batch", None) is self and self._allocator.held.get(handle.slot) is handle

    def release(self, handle) -> None:
        """Return ``handle``'s slot at once; the handle is dead afterwards."""
        if getattr(handle, "batch", None) is not self:
            raise KvCacheError(f"{type(self).__name__}.release: the handle does not belong to this cache")
        self._allocator.give_back(handle.slot, handle)
        handle.cached_len = 0
        handle.released = True

    def rebind_location(self) -> Optional[torch.device]:
        return self._device_location

    def bound_tensors(self) -> list[torch.Tensor]:
        return list(self._bound)

    def rebind_slot(self, layer: int, which: int) -> Optional[torch.Tensor]:
        per = len(self._bound) // self.n_layers
        if not 0 <= layer < self.n_layers or not 0 <= which < per:
            return None
        return self._bound[per * layer + which]

    def row_indices(self, rows: Sequence, positions: torch.Tensor) -> dict:
        """Per-row data of one step: the slot each row owns and the position it writes ([B], [B, 1]).

        ``rows`` holds one handle per bucket row, None for padding (null slot, position 0).
        """
        slots = [NULL_SLOT if r is None else r.slot for r in rows]
        return {"slot_ids": torch.tensor(slots, dtype=torch.int64), "write_index": positions[:, None].clone()}

    def slot_of_row(self, handle) -> int:
        return handle.slot

    # ---- room beyond a free row (a pool-backed cache answers with its blocks) -------------------
    def never_holds(self, positions: int) -> Optional[str]:
        """Why a sequence of ``positions`` positions can never fit, beyond a row's width; None when it can."""
        return None

    def holds_now(self, positions: int) -> bool:
        """Whether a new sequence of ``positions`` positions fits now, given a free row."""
        return True

    def free_room(self) -> str:
        """What is free, for a refusal's message."""
        return f"free rows {self.free_rows}"

    def check_packed_room(self, rows: Sequence, lengths: Sequence[int]) -> None:
        """Refuse, before anything is taken, prompts of ``lengths`` tokens into ``rows`` that do not fit."""

    def packed_writes(self, rows: Sequence, lengths: Sequence[int]) -> dict[str, torch.Tensor]:
        """Where each token of a packed prefill writes: its slot and its position ([N] each)."""
        return {"write_index": torch.cat([torch.arange(n) for n in lengths]),
                "slot_ids": torch.tensor([self.slot_of_row(r) for r, n in zip(rows, lengths) for _ in range(n)],
                                         dtype=torch.int64)}

    # ---- what the batch_isolation oracle audits ----------------------------------------------
    def write_unit(self, row, tensor_index: int) -> tuple[int, int]:
        """(slot, position) of bound tensor ``tensor_index`` that ``row``'s next step writes."""
        return row.slot, row.cached_len

    def poison_unwritten(self, live: Sequence, value: float = float("nan")) -> None:
        """``value`` into every free slot and every position past a live row's length (nothing may read them)."""
        held = {row.slot for row in live}
        for t in self._bound:
            for slot in range(1, self.max_rows + 1):
                if slot not in held:
                    t[slot] = value
            for row in live:
                if t.dim() == 4:  # K/V [N, Hkv, S, D]
                    t[row.slot, :, row.cached_len:] = value
                else:  # latent [N, S, *trailing]
                    t[row.slot, row.cached_len:] = value

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._bound)

    def bytes_per_slot(self) -> int:
        """Bytes one sequence's slot occupies (every layer, every position of its capacity)."""
        return self.nbytes() // (self.max_rows + 1)
