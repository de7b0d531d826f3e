"""Load real checkpoints, offline: GGUF files and HF safetensors directories.

API::

    from fuelpipe.weights import load_model, load_named

    model, tokenizer, report = load_named("smollm2_135m")           # or "gemma3_270m"
    model, tokenizer, report = load_model("path/to/model.gguf", dtype=torch.bfloat16)
    model, tokenizer, report = load_model("path/to/hf_dir")          # config.json + *.safetensors

    ids = tokenizer.encode("The capital of France is")                # BOS as the checkpoint asks
    out = InferenceContext(model, "fx").generate(ids, 32, stop_ids=tokenizer.stop_ids)
    print(tokenizer.decode(out.tokens), report.summary())

``load_model(source, dtype=torch.float32, device="cpu", with_tokenizer=True)``
returns a ``LoadedModel`` named tuple ``(model, tokenizer, report)``:

* ``model``: the registered family's model (``models.registry``), built on
  the meta device and filled with ``load_state_dict(assign=True)``;
* ``tokenizer``: a ``TextTokenizer`` (``encode``, ``decode``, ``stop_ids``,
  ``render_chat``/``encode_chat``), or None if not requested or the HF
  directory has no ``tokenizer.json``;
* ``report``: a ``LoadReport`` with per-phase times, total ``load_s``, the
  resident-memory peak during the load and the stored tensor types.

Accepted: ``.gguf`` files (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K tensors, dequantized by ``fuelpipe.weights.dequant``) and
HF directories (``config.json`` naming one supported architecture, plus
``*.safetensors``). Pickle checkpoints (``.bin``, ``.pt``, ``.pth``,
``.ckpt``) are refused unread. Every refusal is a ``WeightsError`` subclass
(``fuelpipe.weights.errors``) naming the file and the problem.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from fuelpipe.weights.errors import WeightsError
from fuelpipe.weights.loader import (
    LoadedModel, LoadReport, _peak_rss_mb, _reset_peak_rss, _rss_mb, load_gguf, load_hf_dir, sniff_format,
)
from fuelpipe.weights.named import NAMED, named_path
from fuelpipe.weights.tokenizer import TextTokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir

__all__ = ["LoadReport", "LoadedModel", "NAMED", "TextTokenizer", "WeightsError", "load_model", "load_named",
           "named_path"]


def load_model(
    source: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    with_tokenizer: bool = True,
) -> LoadedModel:
    """Load a GGUF file or an HF safetensors directory into its registered family. See the module docstring."""
    path = Path(source).expanduser()
    kind = sniff_format(path)
    rss_before = _rss_mb()
    exact_peak = _reset_peak_rss()
    t_start = time.perf_counter()
    times: dict[str, float] = {}
    tokenizer = None
    if kind == "gguf":
        model, config, arch, types, gguf = load_gguf(path, dtype, times)
        if with_tokenizer:
            t0 = time.perf_counter()
            tokenizer = tokenizer_from_gguf(path, gguf.metadata)
            times["tokenizer"] = time.perf_counter() - t0
        del gguf
        fmt = "gguf"
    else:
        model, config, arch, types = load_hf_dir(path, dtype, times)
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
    unique = {id(p): p for p in model.parameters()}.values()
    report = LoadReport(
        source=path, format=fmt, architecture=arch, family=model.family, config=config, dtype=dtype,
        n_params=sum(p.numel() for p in unique), weights_mb=sum(p.numel() * p.element_size() for p in unique) / 2**20,
        tensor_types=types, timings_s=times, load_s=load_s, rss_before_mb=rss_before, peak_rss_mb=_peak_rss_mb(),
        peak_is_process_lifetime=not exact_peak,
    )
    return LoadedModel(model, tokenizer, report)


def load_named(name: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               with_tokenizer: bool = True) -> LoadedModel:
    """Load a named shipped checkpoint (``smollm2_135m``, ``gemma3_270m``); see ``fuelpipe.weights.named``."""
    return load_model(named_path(name), dtype=dtype, device=device, with_tokenizer=with_tokenizer)
