"""Build a family model from a GGUF file or an HF safetensors directory.

Both paths end the same way: the family's model is built on the meta device
(no storage, ``meta_build``), every checkpoint tensor is checked against the
parameter it maps onto (name, shape, quantisation type, ``tensor_plan``)
before any data is read, then each tensor is materialised once, converted to
the configured dtype, and handed to ``load_state_dict(assign=True)``
(``assign``). Peak memory is therefore the final weights plus one tensor in
flight (and the file's pages, which the kernel can drop).

The format paths: ``gguf_load`` and ``hf_dir_load``; which one a path takes:
``sniff``.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from fuelpipe.resident_memory import current_mb, peak_mb, reset_peak
from fuelpipe.weights.gguf_load import load_gguf
from fuelpipe.weights.hf_dir_load import load_hf_dir
from fuelpipe.weights.load_report import LoadedModel, LoadReport
from fuelpipe.weights.named import named_path
from fuelpipe.weights.sniff import sniff_format
from fuelpipe.weights.tokenizer import tokenizer_from_gguf, tokenizer_from_hf_dir


def load_model(
    source: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    with_tokenizer: bool = True, quant=None,
) -> LoadedModel:
    """Load a GGUF file or an HF safetensors directory into its registered family (see ``fuelpipe.weights``).

    ``quant`` (a ``fuelpipe.quant.QuantSpec``): hold the matrices in a low-bit form. From a GGUF file
    they are packed tensor by tensor, keeping the file's own blocks where the kernels take them."""
    from fuelpipe.quant.modules import logical_params, stored_form

    path = Path(source).expanduser()
    kind = sniff_format(path)
    rss_before = current_mb()
    exact_peak = reset_peak()
    t_start = time.perf_counter()
    times: dict[str, float] = {}
    tokenizer = None
    if kind == "gguf":
        model, config, arch, types, gguf_file = load_gguf(path, dtype, times, quant)
        if with_tokenizer:
            t0 = time.perf_counter()
            tokenizer = tokenizer_from_gguf(path, gguf_file.metadata)
            times["tokenizer"] = time.perf_counter() - t0
        del gguf_file  # unmaps the file: every tensor was copied out of it
        fmt = "gguf"
    else:
        model, config, arch, types = load_hf_dir(path, dtype, times)
        if quant is not None and quant.quantized:
            from fuelpipe.quant.modules import quantize_model

            quantize_model(model, quant)
        if with_tokenizer:
            t0 = time.perf_counter()
            tokenizer = tokenizer_from_hf_dir(path)
            times["tokenizer"] = time.perf_counter() - t0
        fmt = "safetensors"
    if torch.device(device) != torch.device("cpu"):
        t0 = time.perf_counter()
        model = model.to(device)
        times["to_device"] = time.perf_counter() - t0
    load_s = time.perf_counter() - t_start
    unique = {id(p): p for p in list(model.parameters()) + [b for b in model.buffers() if b is not None]}.values()
    report = LoadReport(
        source=path, format=fmt, architecture=arch, family=model.family, config=config, dtype=dtype,
        n_params=logical_params(model), form=stored_form(model),
        weights_mb=sum(p.numel() * p.element_size() for p in unique) / 2**20,
        tensor_types=types, timings_s=times, load_s=load_s, rss_before_mb=rss_before, peak_rss_mb=peak_mb(),
        peak_is_process_lifetime=not exact_peak,
    )
    return LoadedModel(model, tokenizer, report)


def load_named(name: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               with_tokenizer: bool = True, quant=None) -> LoadedModel:
    """Load a named shipped checkpoint (``smollm2_135m``, ``gemma3_270m``); see ``fuelpipe.weights.named``."""
    return load_model(named_path(name), dtype=dtype, device=device, with_tokenizer=with_tokenizer, quant=quant)
