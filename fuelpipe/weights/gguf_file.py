"""A lean GGUF reader: metadata, tensor directory and zero-copy views of tensor bytes.

The format constants (value types, quantisation block sizes, magic, default
alignment) come from the ``gguf`` package. The parsing is ours, because
``gguf.GGUFReader`` builds one numpy view per array element: on a 262k-token
vocabulary that is ~2M small objects and tens of seconds before the first
tensor is touched. Here a numeric array is one ``np.frombuffer`` and a string
array one pass over the bytes, and tensor data stays in the memory map until
it is dequantized.

Layout (little-endian, GGUF v2/v3)::

    magic u32 | version u32 | n_tensors u64 | n_kv u64
    n_kv x   (key: str, type: u32, value)              str = u64 length + utf-8 bytes
    n_tensors x (name: str, n_dims: u32, ne[n_dims]: u64, ggml_type: u32, offset: u64)
    padding to general.alignment, then the data section; each offset is relative to it.

``ne`` lists dimensions fastest-first, so a torch shape is ``tuple(reversed(ne))``.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from fuelpipe.weights.errors import CheckpointFormatError, UnsupportedQuantError

_SCALAR_DTYPES = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (slowest first): reversed GGUF ``ne``
    ggml_type: int  # raw id; ``GGMLQuantizationType(ggml_type)`` when known
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"unknown ggml type {self.ggml_type}"


class _Truncated(Exception):
    pass


class _Cursor:
    """Bounds-checked little-endian reads over a memory map."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Truncated(f"needs bytes [{start}, {start + n}) but the file has {self.size}")
        self.pos = start + n
        return start

    def unpack(self, fmt: str):
        start = self.take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, start)

    def u32(self) -> int:
        return self.unpack("<I")[0]

    def u64(self) -> int:
        return self.unpack("<Q")[0]

    def string(self) -> str:
        n = self.u64()
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8")

    def string_array(self, count: int) -> list[str]:
        buf, pos, size, out = self.buf, self.pos, self.size, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated(f"string array runs past the end of the file ({size} bytes)")
            (n,) = unpack(buf, pos)
            end = pos + 8 + n
            if end > size:
                raise _Truncated(f"string array runs past the end of the file ({size} bytes)")
            out.append(buf[pos + 8 : end].decode("utf-8"))
            pos = end
        self.pos = pos
        return out

    def numeric_array(self, dtype: np.dtype, count: int) -> np.ndarray:
        start = self.take(dtype.itemsize * count)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()


class GgufFile:
    """An open GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> info) and ``raw(info)`` bytes.

    String arrays come back as ``list[str]``, numeric arrays as numpy arrays, scalars as Python values.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file cannot be mapped
            raise CheckpointFormatError(self.path, f"not a GGUF file: {e}") from None
        self.size = len(self._map)
        try:
            self._parse()
        except _Truncated as e:
            raise CheckpointFormatError(self.path, f"truncated GGUF header: {e}") from None
        except UnicodeDecodeError as e:
            raise CheckpointFormatError(self.path, f"corrupt GGUF header: a string is not UTF-8 ({e})") from None

    # ---- header --------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(self._map)
        magic, version = cur.unpack("<II")
        if magic != GGUF_MAGIC:
            raise CheckpointFormatError(self.path, f"not a GGUF file: magic {magic:#010x}, expected {GGUF_MAGIC:#010x}")
        if version not in (2, 3):
            raise CheckpointFormatError(
                self.path, f"GGUF version {version} is not supported (only 2 and 3, little-endian)"
            )
        self.version = version
        n_tensors, n_kv = cur.u64(), cur.u64()
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = self._value(cur, cur.u32(), key)
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if align < 1 or align & (align - 1):
            raise CheckpointFormatError(self.path, f"general.alignment must be a power of two, got {align}")
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: dict[str, GgufTensorInfo] = {}
        for name, shape, ggml_type, rel in infos:
            if name in self.tensors:
                raise CheckpointFormatError(self.path, f"tensor {name!r} appears twice in the directory")
            info = GgufTensorInfo(name, shape, ggml_type, self.data_offset + rel, self._nbytes(name, shape, ggml_type))
            end = info.offset + info.nbytes
            if end > self.size:
                raise CheckpointFormatError(
                    self.path,
                    f"truncated: tensor {name!r} ({info.type_name}, shape {list(shape)}) needs bytes "
                    f"[{info.offset}, {end}) but the file has {self.size}",
                )
            self.tensors[name] = info

    def _value(self, cur: _Cursor, vtype: int, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return cur.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = cur.u32(), cur.u64()
            if etype == GGUFValueType.STRING:
                return cur.string_array(count)
            if etype in _SCALAR_DTYPES:
                return cur.numeric_array(_SCALAR_DTYPES[etype], count)
            if etype == GGUFValueType.ARRAY:
                return [self._value(cur, GGUFValueType.ARRAY, key) for _ in range(count)]
            raise CheckpointFormatError(self.path, f"metadata {key!r}: unknown array element type {etype}")
        if vtype in _SCALAR_DTYPES:
            return cur.numeric_array(_SCALAR_DTYPES[vtype], 1)[0].item()
        raise CheckpointFormatError(self.path, f"metadata {key!r}: unknown value type {vtype}")

    def _tensor_info(self, cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
        name = cur.string()
        n_dims = cur.u32()
        if n_dims > 8:
            raise CheckpointFormatError(self.path, f"tensor {name!r} claims {n_dims} dimensions")
        ne = cur.unpack(f"<{n_dims}Q")
        ggml_type, rel = cur.u32(), cur.u64()
        return name, tuple(int(d) for d in reversed(ne)), ggml_type, rel

    def _nbytes(self, name: str, shape: tuple[int, ...], ggml_type: int) -> int:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise UnsupportedQuantError(
                self.path, f"tensor {name!r} has ggml type id {ggml_type}, which the gguf package does not know"
            ) from None
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if shape and shape[-1] % block:
            raise CheckpointFormatError(
                self.path, f"tensor {name!r}: row length {shape[-1]} is not a multiple of the "
                f"{GGMLQuantizationType(ggml_type).name} block size {block}",
            )
        return n // block * type_size

    # ---- data ----------------------------------------------------------------------------
    def raw(self, info: GgufTensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the map (no copy)."""
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointFormatError(self.path, "metadata has no general.architecture string")
        return arch
