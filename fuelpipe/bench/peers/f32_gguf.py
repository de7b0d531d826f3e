"""Write an F32 GGUF from a quantized one, so llama.cpp runs the very function the f32 peers run.

Hugging Face and fuelpipe both dequantize the shipped Q4_1 file to f32. Handing
llama.cpp the Q4_1 file instead would compare different arithmetic (it keeps
the weights quantized and quantizes activations to 8 bits), so the fair
llama.cpp row runs an F32 file holding exactly those dequantized values.
Tensor names, order and every metadata key are copied; only the tensor types
and ``general.file_type`` change. The file is cached next to its stamp.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

F32_FILE_TYPE = 0  # llama.cpp's LLAMA_FTYPE_ALL_F32


def f32_gguf_path(source: Path, cache: Path) -> Path:
    """The F32 twin of ``source`` in ``cache``, written once (atomically) and reused while ``source`` is unchanged."""
    import gguf

    target = cache / (source.stem + ".F32.gguf")
    stamp = target.with_name(target.name + ".source.json")
    st = source.stat()
    want = {"source": str(source), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if target.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = F32_FILE_TYPE if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    tensors = []
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)  # logical shape
        tensors.append((t.name, np.ascontiguousarray(data)))
    for name, data in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    tmp.replace(target)
    stamp.write_text(json.dumps(want))
    return target


Q8_0_FILE_TYPE = 7  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q8_0


def q8_0_gguf_path(f32_path: Path) -> Path:
    """llama.cpp's own Q8_0 quantization of the F32 twin (its quantizer, its recipe), written once beside it."""
    import ctypes

    import llama_cpp

    target = f32_path.with_name(f32_path.name.replace(".F32.", ".Q8_0."))
    stamp = target.with_name(target.name + ".source.json")
    st = f32_path.stat()
    want = {"source": str(f32_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if target.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = Q8_0_FILE_TYPE
    rc = llama_cpp.llama_model_quantize(str(f32_path).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {f32_path} to Q8_0 (return code {rc})")
    tmp.replace(target)
    stamp.write_text(json.dumps(want))
    return target
