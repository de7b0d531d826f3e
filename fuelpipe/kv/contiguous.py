"""Contiguous KV cache: pre-allocated per-layer K and V buffers, written in place.

Layout per layer and slot: [1, n_kv_heads, max_seq_len, head_dim], zero-initialised.
``alloc_id`` names the allocation (the buffers a plan is welded to), never the
conversation: replacing storage re-mints it, rewinding keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fuelpipe.errors import (
    KvByteLengthError,
    KvCacheError,
    KvCapacityError,
    KvLayerError,
    KvNoCapacityError,
)
from fuelpipe.identity import KvAllocId
from fuelpipe.kv.allocation import Allocation, UpFrontSequence
from fuelpipe.kv.sizes import check_dtype, check_size

K, V = 0, 1
SLOT_NAMES = ("K", "V")


@dataclass
class KvLayer:
    k: torch.Tensor  # [1, Hkv, S, D]
    v: torch.Tensor  # [1, Hkv, S, D]
    k_version: int = 0
    v_version: int = 0

    def slot(self, which: int) -> torch.Tensor:
        return (self.k, self.v)[which]


class ContiguousKvCache(UpFrontSequence, Allocation):
    """One request's KV allocation for every layer of one model."""

    kv_layout = "contiguous"  # fuelpipe.kv.contiguous_layout
    batched = False

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq_len: Optional[int],
        dtype: Optional[torch.dtype],
        device: torch.device | str | None,
    ) -> None:
        n_layers, n_kv_heads, head_dim = (check_size("ContiguousKvCache", name, v) for name, v in (
            ("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)))
        if max_seq_len is not None:
            max_seq_len = check_size("ContiguousKvCache", "max_seq_len", max_seq_len)
        if dtype is not None:
            dtype = check_dtype("ContiguousKvCache", dtype)
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.cached_len = 0
        self.layers: list[Optional[KvLayer]] = [None] * n_layers
        self._alloc_id = KvAllocId.mint()
        self._device_location: Optional[torch.device] = None
        if max_seq_len is not None and dtype is not None:
            dev = torch.device(device if device is not None else "cpu")
            self._allocate(dev)

    @classmethod
    def with_capacity(cls, n_layers, n_kv_heads, head_dim, max_seq_len, dtype=torch.float32, device="cpu"):
        return cls(n_layers, n_kv_heads, head_dim, max_seq_len, dtype, device)

    @classmethod
    def with_dims(cls, n_layers: int, n_kv_heads: int, head_dim: int) -> "ContiguousKvCache":
        """A cache with no fixed capacity, dtype or residency: layers arrive by ``set_layer``."""
        return cls(n_layers, n_kv_heads, head_dim, None, None, None)

    def _allocate(self, dev: torch.device) -> None:
        shape = (1, self.n_kv_heads, self.max_seq_len, self.head_dim)
        self.layers = [
            KvLayer(torch.zeros(shape, dtype=self.dtype, device=dev), torch.zeros(shape, dtype=self.dtype, device=dev))
            for _ in range(self.n_layers)
        ]
        # Measured at the one moment it is certain: we just allocated every buffer here.
        self._device_location = self.layers[0].k.device

    @property
    def has_capacity(self) -> bool:
        return self.max_seq_len is not None and self.dtype is not None

    # ---- lifecycle ------------------------------------------------------------------------
    def set_layer(self, index: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Install caller-supplied storage for one layer: a new allocation of unprovable residency."""
        self._layer_index(index)
        for name, t in (("k", k), ("v", v)):
            ok = t.dim() == 4 and t.shape[0] == 1 and t.shape[1] == self.n_kv_heads and t.shape[3] == self.head_dim
            if self.max_seq_len is not None:
                ok = ok and t.shape[2] == self.max_seq_len
            if self.dtype is not None:
                ok = ok and t.dtype == self.dtype
            if not ok:
                raise KvLayerError(
                    f"set_layer: {name} must be [1, n_kv_heads={self.n_kv_heads}, "
                    f"{self.max_seq_len if self.max_seq_len is not None else 'S'}, head_dim={self.head_dim}]"
                    f"{' of ' + str(self.dtype) if self.dtype is not None else ''}, got {list(t.shape)} of {t.dtype}"
                )
        if k.shape != v.shape or k.dtype != v.dtype:
            raise KvLayerError(f"set_layer: k {list(k.shape)}/{k.dtype} and v {list(v.shape)}/{v.dtype} must match")
        self.layers[index] = KvLayer(k, v)
        self._alloc_id = KvAllocId.mint()
        self._device_location = None

    def clear(self) -> None:
        """Release every buffer and allocate fresh zeroed ones: a new allocation (re-mints alloc_id)."""
        self.cached_len = 0
        self._alloc_id = KvAllocId.mint()
        if self.has_capacity and self._device_location is not None:
            self._allocate(self._device_location)
        else:
            self.layers = [None] * self.n_layers
            self._device_location = None

    def reset(self) -> None:
        """Zero the buffers in place and rewind to empty; the allocation (and any plan on it) is kept."""
        for layer in self.layers:
            if layer is not None:
                layer.k.zero_()
                layer.v.zero_()
        self.cached_len = 0

    def truncate_to(self, new_len: int) -> None:
        """Rewind to ``new_len`` positions (speculative rollback); keeps alloc_id and the buffers.

        Only rewinds: a ``new_len`` past ``cached_len`` would claim positions nothing wrote, so it
        is refused (``KvCapacityError``) and nothing changes. Positions from ``new_len`` on keep
        their stale contents; the mask hides them until a step overwrites them.
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

    # ---- what a plan reads ----------------------------------------------------------------
    @property
    def width(self) -> Optional[int]:
        """Attention width of a step: the whole capacity."""
        return self.max_seq_len

    def plan_geometry(self, seq: int) -> tuple:
        return (("seq", seq), ("max_seq_len", self.max_seq_len))

    def write_index(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, dtype=torch.int64)  # [n]

    def block_table(self) -> None:
        return None

    # ---- checks ---------------------------------------------------------------------------
    def check_room(self, start: int, n: int) -> None:
        if self.max_seq_len is None:
            raise KvNoCapacityError("ContiguousKvCache: cache has no fixed capacity (built with with_dims)")
        if start < 0 or n < 0 or start + n > self.max_seq_len:
            raise KvCapacityError(
                f"ContiguousKvCache: positions [{start}, {start + n}) exceed max_seq_len {self.max_seq_len}"
            )

    def _layer_index(self, index: int) -> None:
        if not 0 <= index < self.n_layers:
            raise KvLayerError(f"ContiguousKvCache: layer {index} out of range [0, {self.n_layers})")

    def layer(self, index: int) -> KvLayer:
        self._layer_index(index)
        layer = self.layers[index]
        if layer is None:
            raise KvLayerError(f"ContiguousKvCache: layer {index} is unpopulated")
        return layer

    # ---- host writes ----------------------------------------------------------------------
    def write_bytes(self, layer_index: int, slot: int, start: int, n: int, data: bytes) -> None:
        """Write host bytes (head-major [1, Hkv, n, D], little-endian) into positions [start, start+n).

        Writes into the existing buffer, so the allocation and any plan welded to it are kept.
        """
        if not self.has_capacity:
            raise KvNoCapacityError(
                "ContiguousKvCache.write_bytes: cache has no fixed capacity/dtype (built with with_dims)"
            )
        self.check_room(start, n)
        if slot not in (K, V):
            raise KvLayerError(f"ContiguousKvCache.write_bytes: slot must be 0 (K) or 1 (V), got {slot}")
        elem = torch.empty((), dtype=self.dtype).element_size()
        want = n * self.n_kv_heads * self.head_dim * elem
        if len(data) != want:
            raise KvByteLengthError(
                f"ContiguousKvCache.write_bytes: got {len(data)} bytes, expected {want} "
                f"([1, n_kv_heads={self.n_kv_heads}, n={n}, head_dim={self.head_dim}] of {self.dtype})"
            )
        layer = self.layer(layer_index)
        src = torch.frombuffer(bytearray(data), dtype=self.dtype).view(1, self.n_kv_heads, n, self.head_dim)
        layer.slot(slot)[:, :, start : start + n].copy_(src)
        self.bump_version(layer_index, slot)

    def bump_version(self, layer_index: int, slot: int) -> None:
        layer = self.layer(layer_index)
        if slot == K:
            layer.k_version += 1
        else:
            layer.v_version += 1

    def bump_all_versions(self) -> None:
        for layer in self.layers:
            if layer is not None:
                layer.k_version += 1
                layer.v_version += 1

    # ---- rebind source --------------------------------------------------------------------
    def rebind_location(self) -> Optional[torch.device]:
        return self._device_location

    def rebind_slot(self, layer: int, which: int) -> Optional[torch.Tensor]:
        if not 0 <= layer < self.n_layers or which not in (K, V):
            return None
        entry = self.layers[layer]
        return None if entry is None else entry.slot(which)

    def bound_tensors(self) -> list[torch.Tensor]:
        """Flat [k0, v0, k1, v1, ...] list a step program is bound to."""
        out = []
        for i in range(self.n_layers):
            layer = self.layer(i)
            out += [layer.k, layer.v]
        return out

    # ---- accounting -----------------------------------------------------------------------
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype or torch.float32).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bound_tensors()) if self.has_capacity else 0
