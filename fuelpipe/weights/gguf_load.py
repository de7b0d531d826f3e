"""Build a family model from a GGUF file: metadata -> config, llama.cpp tensor names -> parameters.

Every tensor is checked (name, shape, type) before any is dequantized; each is
then dequantized once, refused if not finite, un-transformed where llama.cpp
stored it transformed, and converted to the configured dtype. With a low-bit
``quant``, the matrices are packed straight from the file instead, keeping the
file's own blocks where the kernels take them.
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from fuelpipe.weights import dequant
from fuelpipe.weights.architectures import TensorRule, by_gguf_arch
from fuelpipe.weights.assign import assign, put
from fuelpipe.weights.config_readers import GgufConfigReader
from fuelpipe.weights.errors import UnknownArchitectureError, UnsupportedQuantError
from fuelpipe.weights.finite import check_finite
from fuelpipe.weights.gguf_file import GgufFile
from fuelpipe.weights.meta_build import build_config, family_of, meta_model, read_config
from fuelpipe.weights.tensor_plan import PlannedTensor, check_shape, plan_tensors
from models.registry import did_you_mean


def expand_rules(rules: tuple[TensorRule, ...], n_layers: int) -> dict[str, tuple[str, Any]]:
    """Checkpoint name -> (parameter name, transform), with every ``{i}`` rule written out per layer."""
    out: dict[str, tuple[str, Any]] = {}
    for r in rules:
        if "{i}" in r.source:
            for i in range(n_layers):
                out[r.source.format(i=i)] = (r.target.format(i=i), r.transform)
        else:
            out[r.source] = (r.target, r.transform)
    return out


def _matrix_targets(model: torch.nn.Module, quant) -> dict[str, bool]:
    """Weight name -> is a vocabulary matrix, for every matrix ``quant`` will pack."""
    from torch import nn

    from fuelpipe.quant.formats import fits
    from fuelpipe.quant.modules import vocabulary_matrix

    out = {}
    for name, module in model.named_modules():
        if type(module) in (nn.Linear, nn.Embedding) and fits(quant, module.weight.shape[1]):
            out[f"{name}.weight"] = vocabulary_matrix(name, module)
    return out


def _packed_from_file(path: Path, f, info, p: PlannedTensor, config, quant, vocabulary: bool):
    """One matrix of the file in the packed form ``quant`` asks for: its own blocks when usable, else quantized."""
    from fuelpipe.quant import gguf_blocks
    from fuelpipe.quant.formats import quantize

    kind = gguf_blocks.kind_for(quant, vocabulary, info.ggml_type)
    packed = gguf_blocks.packed_from_blocks(f.raw(info), info.ggml_type, info.shape, kind, quant.group_size)
    if packed is not None:
        if p.transform is None:
            return packed, True
        perm = gguf_blocks.row_permutation(p.transform, info.shape[0], config)
        if perm is not None:
            return gguf_blocks.permute_rows(packed, perm), True
    w = torch.from_numpy(dequant.dequantize(f.raw(info), info.ggml_type, info.shape))
    check_finite(path, p.source, w)
    if p.transform is not None:
        w = p.transform(w, config)
    return quantize(w, kind, quant.group_size), False


def load_gguf(path: Path, dtype: torch.dtype, report_times: dict[str, float], quant=None):
    t0 = time.perf_counter()
    f = GgufFile(path)
    arch_name = f.architecture
    archs = by_gguf_arch()
    if arch_name not in archs:
        raise UnknownArchitectureError(path, did_you_mean("GGUF architecture", arch_name, archs))
    arch = archs[arch_name]
    entry = family_of(path, arch, arch_name)
    shapes = {name: info.shape for name, info in f.tensors.items()}
    reader = GgufConfigReader(path, arch_name, f.metadata, shapes)
    fields = read_config(path, lambda: arch.config_from_gguf(reader), "the GGUF metadata")
    config = build_config(path, entry, fields)
    report_times["header"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = meta_model(entry, config, dtype)
    n_layers = model.dims.n_layers
    table = expand_rules(arch.gguf_tensors, n_layers)
    reverse = {target: src for src, (target, _) in table.items()}
    plan = plan_tensors(path, model, f.tensors, table.get, lambda t: reverse.get(t, "?"), f"{arch.family} model")
    params = dict(model.named_parameters(remove_duplicate=False))
    for p in plan:
        info = f.tensors[p.source]
        if not dequant.is_supported(info.ggml_type):
            raise UnsupportedQuantError(
                path, f"tensor {p.source!r} is stored as {info.type_name}, which this loader cannot dequantize; "
                f"supported: {', '.join(t.name for t in dequant.SUPPORTED_TYPES)}"
            )
        check_shape(path, p.source, info.shape, params[p.target].shape, p.target)
    report_times["build"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    first: dict[str, str] = {}
    checked = 0.0
    matrices = _matrix_targets(model, quant) if quant is not None and quant.quantized else {}
    packed: dict = {}
    as_is = 0
    for p in plan:
        info = f.tensors[p.source]
        if p.target in matrices:
            # Packed straight from the file, one tensor at a time: the f32 model never exists.
            if p.target not in packed:
                packed[p.target], kept = _packed_from_file(path, f, info, p, config, quant, matrices[p.target])
                as_is += kept
            continue
        w = torch.from_numpy(dequant.dequantize(f.raw(info), info.ggml_type, info.shape))
        t1 = time.perf_counter()
        check_finite(path, p.source, w)  # as stored (dequantized), before any transform moves the values
        checked += time.perf_counter() - t1
        if p.transform is not None:
            w = p.transform(w, config)
        put(path, tensors, first, p, w.to(dtype))
    if matrices:
        from fuelpipe.quant.modules import quantize_model

        quantize_model(model, quant, packed)
        model.packed_as_stored = as_is  # matrices whose file blocks were kept as they are
    assign(path, model, tensors, only_meta=bool(matrices))
    report_times["weights"] = time.perf_counter() - t0 - checked
    report_times["finite_check"] = checked
    types = Counter(f.tensors[p.source].type_name for p in plan)
    return model, config, arch_name, dict(types), f
