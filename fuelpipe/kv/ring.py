"""kv=ring: a layer that attends through a sliding window keeps only its window, written modulo it.

A windowed layer (Gemma 3's local layers, every layer of a Mistral-style model) never attends a
key more than ``window - 1`` positions back, so its K/V live in a ring of ``W = window`` slots:
position ``p`` is written to slot ``p % W``. Full-attention layers keep a
contiguous buffer of ``max_seq_len`` positions. KV memory per sequence drops from
``n_layers * max_seq_len`` positions to ``n_full * max_seq_len + n_windowed * W``.

The step (signature ``ring``) takes the tensor-offset inputs (``write_index`` = the positions
written this step). A ring layer reads the ring *before* it writes: slot ``j`` then holds the
newest position ``< start`` congruent to ``j`` (``start - 1 - ((start - 1 - j) mod W)``, negative
when nothing was written there), the step's own keys are appended, and the layer's mask is
computed in the graph from those positions (causal and within the window). Then the step's last
``min(T, W)`` keys are written into the ring. A prompt longer than the window is therefore
correct in one step. Everything a layer reads that no query may attend comes back as exactly 0,
as in every layout.

A ring forgets: ``truncate_to`` refuses (typed) to rewind a cache once any ring has wrapped,
since the positions a rewound step would attend have been overwritten.

This file is the whole layout: cache, views, signature and registration (``KV_LAYOUT``, found by
``fuelpipe.kv.layout``); ``conf/kv/ring.yaml`` selects it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fuelpipe.errors import ConfigError, KvCacheError, KvCapacityError
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.allocation import Allocation, UpFrontSequence
from fuelpipe.kv.layout import KvLayout, StepSignature
from fuelpipe.kv.sizes import check_dtype, check_size
from fuelpipe.kv.batch_slots import NULL_SLOT, SlotAllocator, SlotBatchCache
from fuelpipe.kv.batch_views import SlotKv, write_rows
from fuelpipe.kv.packed_views import PackedSlotKv
from fuelpipe.kv.views import CleansMaskedSlots, TensorOffsetKv


class RingKv(CleansMaskedSlots):
    """A windowed layer's rings ``[N, Hkv, W, D]``: row b is ring ``slot_ids[b]`` (one sequence: N = 1, no
    slot ids) and writes positions ``write_pos[b] [T]``."""

    def __init__(self, k_rings, v_rings, write_pos: torch.Tensor, slot_ids: Optional[torch.Tensor], window: int
                 ) -> None:
        self.k_rings, self.v_rings = k_rings, v_rings  # [N, Hkv, W, D]
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [B, T] int64, [B] int64 or None
        self.window = window  # a Python int: the ring's size, static under tracing

    def _rows(self, rings: torch.Tensor) -> torch.Tensor:
        return rings if self.slot_ids is None else rings.index_select(0, self.slot_ids)  # [B, Hkv, W, D]

    def _write(self, rings: torch.Tensor, x: torch.Tensor, into: torch.Tensor) -> None:
        if self.slot_ids is None:
            rings.index_copy_(2, into[0], x)
        else:
            write_rows(rings, self.slot_ids, into, x)

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v [B, Hkv, T, D] -> (K, V [B, Hkv, W + T, D], mask [B, 1, T, W + T]); ``mask`` (full width) unused."""
        ring, pos = self.window, self.write_pos  # pos [B, T]
        slots = torch.arange(ring, device=pos.device)  # [W]
        start = pos[:, :1]  # [B, 1]
        held = start - 1 - torch.remainder(start - 1 - slots[None, :], ring)  # [B, W] position per slot; < 0: none
        key_pos = torch.cat([held, pos], dim=1)  # [B, W + T]
        distance = pos[:, :, None] - key_pos[:, None, :]  # [B, T, W + T] query minus key
        ok = (key_pos[:, None, :] >= 0) & (distance >= 0) & (distance < ring)
        own = torch.zeros_like(distance, dtype=k.dtype).masked_fill(~ok, float("-inf"))[:, None]  # [B, 1, T, W+T]
        keys = torch.cat([self._rows(self.k_rings), k], dim=2)  # read before the write below
        values = torch.cat([self._rows(self.v_rings), v], dim=2)
        into = torch.remainder(pos[:, -ring:], ring)  # the step's newest (at most W) positions are what a ring keeps
        self._write(self.k_rings, k[:, :, -ring:], into)
        self._write(self.v_rings, v[:, :, -ring:], into)
        return self._visible(keys, own, 2), self._visible(values, own, 2), own


class PackedRingKv:
    """Packed fresh prompts into a batch's rings: token n writes (slot_ids[n], write_pos[n] mod W) unless a later
    token of its prompt (W positions on) takes that slot; attention reads the step's own K/V (the packed mask
    carries the window)."""

    def __init__(self, k_rings, v_rings, write_pos, slot_ids, window: int) -> None:
        self.k_rings, self.v_rings = k_rings, v_rings  # [N_slots, Hkv, W, D]
        self.write_pos, self.slot_ids = write_pos, slot_ids  # [N], [N]
        self.window = window

    def write_and_read(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """k, v [1, Hkv, N, D]; mask [1, 1, N, N]. Returns the step's own (k, v, mask)."""
        n = self.slot_ids.shape[0]
        later = torch.cat([self.slot_ids[self.window:], self.slot_ids.new_full((self.window,), -1)])[:n]
        slots = torch.where(later == self.slot_ids, NULL_SLOT, self.slot_ids)  # superseded: the null slot
        into = torch.remainder(self.write_pos, self.window)[None]  # [1, N]
        heads = torch.arange(k.shape[1], device=k.device)  # [Hkv]
        index = (slots[None, :], heads[:, None], into)  # broadcast to [Hkv, N]
        self.k_rings.index_put_(index, k[0])
        self.v_rings.index_put_(index, v[0])
        return k, v, mask


def _views(backbone, a: dict, kv: list) -> list:
    """One sequence: full layers as the tensor-offset path, windowed layers as rings."""
    pos = a["write_index"][None]  # [1, T]
    return [TensorOffsetKv(kv[2 * i], kv[2 * i + 1], a["write_index"]) if w is None
            else RingKv(kv[2 * i], kv[2 * i + 1], pos, None, w) for i, w in enumerate(_windows(backbone))]


def _batch_views(backbone, a: dict, kv: list) -> list:
    return [SlotKv(kv[2 * i], kv[2 * i + 1], a["write_index"], a["slot_ids"]) if w is None
            else RingKv(kv[2 * i], kv[2 * i + 1], a["write_index"], a["slot_ids"], w)
            for i, w in enumerate(_windows(backbone))]


def _packed_views(backbone, a: dict, kv: list) -> list:
    return [PackedSlotKv(kv[2 * i], kv[2 * i + 1], a["write_index"], a["slot_ids"]) if w is None
            else PackedRingKv(kv[2 * i], kv[2 * i + 1], a["write_index"], a["slot_ids"], w)
            for i, w in enumerate(_windows(backbone))]


RING = StepSignature("ring", ("write_index",), _views)
BATCH_RING = StepSignature("batch_ring", ("write_index", "slot_ids"), _batch_views)
PACKED_RING = StepSignature("packed_ring", ("write_index", "slot_ids", "last_index"), _packed_views)


def _windows(model) -> tuple[Optional[int], ...]:
    """Each layer's attention window (None: full attention), from the model's mask plan."""
    plan = model.mask_plan
    return tuple(plan.window_of(kind) for kind in plan.layer_types)


class _RingGeometry:
    """What a ring cache and a batch of them share: checked geometry, one window per layer, slots per layer."""

    kv_layout = "ring"

    def _init_geometry(self, what: str, n_kv_heads, head_dim, windows, max_seq_len, dtype) -> None:
        self.n_kv_heads = check_size(what, "n_kv_heads", n_kv_heads)
        self.head_dim = check_size(what, "head_dim", head_dim)
        self.max_seq_len = check_size(what, "max_seq_len", max_seq_len)
        self.dtype = check_dtype(what, dtype)
        windows = tuple(windows)
        bad = [w for w in windows if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1)]
        if not windows or bad:
            raise KvCacheError(f"{what}: one window per layer (an int >= 1, or None for full attention), "
                               f"got {list(windows)}")
        self.windows = windows
        self.n_layers = len(windows)

    @property
    def widths(self) -> tuple[int, ...]:
        """Slots per layer: the window for a windowed layer, the whole capacity for a full one.

        A ring is its window even when ``max_seq_len`` is shorter (the step's shapes follow the model's
        windows, not the cache), so a cache shorter than a window saves nothing on that layer."""
        return tuple(self.max_seq_len if w is None else w for w in self.windows)


class RingKvCache(_RingGeometry, UpFrontSequence, Allocation):
    """One sequence: a ring of ``window`` slots per windowed layer, ``max_seq_len`` slots per full one."""

    batched = False

    def __init__(self, n_kv_heads: int, head_dim: int, windows, max_seq_len: int, dtype: torch.dtype,
                 device) -> None:
        self._init_geometry(type(self).__name__, n_kv_heads, head_dim, windows, max_seq_len, dtype)
        self.cached_len = 0
        self._device = torch.device(device if device is not None else "cpu")
        self._allocate()

    def _allocate(self) -> None:
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer K, V [1, Hkv, width, D]
        for width in self.widths:
            shape = (1, self.n_kv_heads, width, self.head_dim)
            self.buffers.append((torch.zeros(shape, dtype=self.dtype, device=self._device),
                                 torch.zeros(shape, dtype=self.dtype, device=self._device)))
        self._alloc_id = KvAllocId.mint()
        self._device_location: Optional[torch.device] = self.buffers[0][0].device

    # ---- lifecycle --------------------------------------------------------------------------
    def check_room(self, start: int, n: int) -> None:
        if start < 0 or n < 0 or start + n > self.max_seq_len:
            raise KvCapacityError(f"RingKvCache: positions [{start}, {start + n}) exceed max_seq_len {self.max_seq_len}")

    @property
    def rewind_floor(self) -> int:
        """The shortest length ``truncate_to`` accepts now: ``cached_len`` once a ring has wrapped, else 0."""
        wrapped = any(w is not None and self.cached_len > w for w in self.windows)
        return self.cached_len if wrapped else 0

    def truncate_to(self, new_len: int) -> None:
        """Rewind to ``new_len`` positions, while no ring has wrapped (else refused, typed; nothing changes)."""
        if isinstance(new_len, bool) or not isinstance(new_len, int):
            raise KvCacheError(f"truncate_to: new_len must be an int, got {type(new_len).__name__} {new_len!r}")
        if not 0 <= new_len <= self.cached_len:
            raise KvCapacityError(f"truncate_to: new_len must lie in [0, cached_len {self.cached_len}] "
                                  f"(truncate only rewinds), got {new_len}")
        if 0 < new_len < self.rewind_floor:
            layer, ring = next((i, w) for i, w in enumerate(self.windows) if w is not None and self.cached_len > w)
            raise KvCapacityError(
                f"truncate_to({new_len}): a ring cache cannot rewind once a ring has wrapped: layer {layer}'s "
                f"{ring} slots hold positions from {self.cached_len - ring} on, and the positions before {new_len} "
                "it would attend were overwritten (reset() or clear() start over)")
        self.cached_len = new_len

    def reset(self) -> None:
        """Zero the buffers in place and rewind to empty; the allocation (and a plan on it) is kept."""
        for k, v in self.buffers:
            k.zero_()
            v.zero_()
        self.cached_len = 0

    def clear(self) -> None:
        """Fresh zeroed buffers: a new allocation (re-mints alloc_id)."""
        self.cached_len = 0
        self._allocate()

    def bump_all_versions(self) -> None:  # no per-slot versions: rebind checks the storage itself
        pass

    # ---- what a plan reads ------------------------------------------------------------------
    @property
    def width(self) -> int:
        """The mask's width (the full layers'); ring layers build their own mask in the step."""
        return self.max_seq_len

    def plan_geometry(self, seq: int) -> tuple:
        return (("seq", seq), ("max_seq_len", self.max_seq_len), ("ring_widths", self.widths))

    def write_index(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, dtype=torch.int64)  # [n] positions

    def block_table(self) -> None:
        return None

    def rebind_location(self) -> Optional[torch.device]:
        return self._device_location

    def rebind_slot(self, layer: int, which: int) -> Optional[torch.Tensor]:
        if not 0 <= layer < self.n_layers or which not in (0, 1):
            return None
        return self.buffers[layer][which]

    def bound_tensors(self) -> list[torch.Tensor]:
        return [t for pair in self.buffers for t in pair]

    def bytes_per_token(self) -> int:
        """Bytes one more position of capacity costs: the full layers' (a ring's size is fixed by its window)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return sum(2 * self.n_kv_heads * self.head_dim * elem for w in self.windows if w is None)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bound_tensors())


class BatchRingCache(_RingGeometry, SlotBatchCache):
    """Rings for ``n_slots`` sequences plus the null slot padding rows write: per layer K and V
    ``[n_slots + 1, Hkv, width, D]``; a sequence's handle is a ``RingSlotCache`` over its slot."""

    def __init__(self, n_kv_heads, head_dim, windows, n_slots, max_seq_len, dtype=torch.float32, device="cpu"):
        self._init_geometry("BatchRingCache", n_kv_heads, head_dim, windows, max_seq_len, dtype)
        n_slots = check_size("BatchRingCache", "n_slots", n_slots)
        dev = torch.device(device)
        self._bound = [torch.zeros((n_slots + 1, self.n_kv_heads, width, self.head_dim), dtype=self.dtype, device=dev)
                       for width in self.widths for _ in (0, 1)]
        self._allocator = SlotAllocator(n_slots, "BatchRingCache")
        self._init_identity()

    def plan_geometry(self, bucket: int, seq: int) -> tuple:
        return (("bucket", bucket), ("seq", seq), ("slots", self.max_rows + 1), ("max_seq_len", self.max_seq_len),
                ("ring_widths", self.widths))

    def write_unit(self, row, tensor_index: int) -> tuple[int, int]:
        """(slot, ring slot or position) of bound tensor ``tensor_index`` that ``row``'s next step writes."""
        return row.slot, row.cached_len % self.widths[tensor_index // 2]

    def poison_unwritten(self, live, value: float = float("nan")) -> None:
        """``value`` into every free slot, every slot of a live row's ring or buffer no position has reached, and
        the ring slot its next position takes (it holds a position one window back, which nothing attends)."""
        held = {row.slot for row in live}
        for i, t in enumerate(self._bound):
            width = self.widths[i // 2]
            for slot in range(1, self.max_rows + 1):
                if slot not in held:
                    t[slot] = value
            for row in live:
                if row.cached_len < width:
                    t[row.slot, :, row.cached_len:] = value
                else:  # the slot the next position takes holds one a window back: no query may read it
                    t[row.slot, :, row.cached_len % width] = value

    def slot_handle(self, slot: int) -> "RingSlotCache":
        return RingSlotCache(self, slot)


class RingSlotCache(RingKvCache):
    """One sequence's slot of a ``BatchRingCache``, usable as a one-sequence ring cache (prefill, solo decode);
    its own allocation for plan keys, its storage the batch's."""

    def __init__(self, batch: BatchRingCache, slot: int) -> None:
        self.batch, self.slot, self.released = batch, slot, False
        self._init_geometry("RingSlotCache", batch.n_kv_heads, batch.head_dim, batch.windows, batch.max_seq_len,
                            batch.dtype)
        self.cached_len = 0
        self._device = batch.device_location
        self._allocate()

    def _allocate(self) -> None:  # views of the batch's buffers, never storage of its own
        bound = self.batch.bound_tensors()
        self.buffers = [(bound[2 * i][self.slot : self.slot + 1], bound[2 * i + 1][self.slot : self.slot + 1])
                        for i in range(self.n_layers)]
        self._alloc_id = KvAllocId.mint()
        self._device_location = self.batch.device_location

    def clear(self) -> None:
        raise KvCacheError("RingSlotCache.clear: a batch slot's storage belongs to its BatchRingCache; "
                           "release the slot and acquire another instead")

    def check_room(self, start: int, n: int) -> None:
        if self.released:
            raise KvCacheError(f"RingSlotCache: slot {self.slot} was released; acquire a new one")
        super().check_room(start, n)


@dataclass(frozen=True)
class RingLayout(KvLayout):
    name = "ring"

    def signatures(self):
        return (RING, BATCH_RING, PACKED_RING)

    def signature(self, offset_mode: str, *, batched: bool = False, packed: bool = False) -> StepSignature:
        # the tensor-offset inputs on either offset mode: a ring layer needs the step's positions as a tensor
        return PACKED_RING if packed else BATCH_RING if batched else RING

    def serves(self, model) -> list[str]:
        if model.latent_slots is not None:
            return [f"{model.family} is an MLA family: it decodes from kv=latent, not a per-head ring"]
        return []

    def check_cache(self, model, cache) -> None:
        super().check_cache(model, cache)
        d = model.dims
        if (cache.n_layers, cache.n_kv_heads, cache.head_dim) != (d.n_layers, d.n_kv_heads, d.head_dim):
            raise ConfigError(f"cache geometry (layers, kv heads, head_dim) = "
                              f"{(cache.n_layers, cache.n_kv_heads, cache.head_dim)} does not match the model's "
                              f"{(d.n_layers, d.n_kv_heads, d.head_dim)}")
        if cache.windows != _windows(model):
            raise ConfigError(f"ring cache windows {cache.windows} are not the model's {_windows(model)}")

    def new_cache(self, ctx, spec, max_seq_len: int, dtype=None) -> RingKvCache:
        self.check_serves(ctx.model)  # what it serves
        d = ctx.model.dims
        return RingKvCache(d.n_kv_heads, d.head_dim, _windows(ctx.model), ctx.check_positions("new_cache", max_seq_len),
                           dtype or ctx.dtype, ctx.device)


    def new_batch(self, ctx, spec, max_batch: int, max_seq_len: int, dtype=None) -> BatchRingCache:
        self.check_serves(ctx.model)  # what it serves
        d = ctx.model.dims
        return BatchRingCache(d.n_kv_heads, d.head_dim, _windows(ctx.model), max_batch,
                              ctx.check_positions("new_batch_cache", max_seq_len), dtype or ctx.dtype, ctx.device)


KV_LAYOUT = RingLayout()
