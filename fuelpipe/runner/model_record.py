"""What a job actually ran: the model's family, where it came from and its key sizes (results.json ``model``).

For a checkpoint the composed ``model.family``/``model.size`` say nothing certain (``model.weights=hf_dir
model.path=<a Gemma 3 directory>`` still composes the default ``llama smollm2_135m``); the record is read
from the loaded model and its load report, and a disagreeing ``model.family`` is named in ``family_mismatch``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from omegaconf import DictConfig

from fuelpipe.config.schema import Weights


def model_record(m: DictConfig, model, report: Optional[Any]) -> dict[str, Any]:
    """``m`` is the composed model config, ``report`` the checkpoint's ``LoadReport`` (None for random weights)."""
    from fuelpipe.quant.modules import logical_params, stored_form

    params = {id(p): p for p in model.parameters()}.values()
    record = {
        "family": model.family,
        "architecture": report.architecture if report is not None else None,
        "source": m.weights.value if report is None else report.format,
        "path": str(report.source) if report is not None else None,
        "size": m.size if m.weights in (Weights.random, Weights.shipped) else None,
        "dtype": str(next(iter(params)).dtype).removeprefix("torch."),
        "n_params": logical_params(model),  # a packed matrix counts as the out x in parameters it holds
        "weights_form": stored_form(model),  # float32, or e.g. "int8/g32/a16 matrices + float32"
        "dims": dataclasses.asdict(model.dims),
        "family_mismatch": None,
    }
    if model.family != m.family:
        record["family_mismatch"] = (
            f"model.family={m.family} (model.size={m.size}) is not what was loaded: {record['path']} is a "
            f"{model.family} model ({record['architecture']}); this run used {model.family}"
        )
    return record


def describe(record: dict[str, Any]) -> str:
    """One line: family, architecture, source and key sizes."""
    d = record["dims"]
    origin = f"{record['architecture']} from {record['path']}" if record["path"] else f"{record['source']} weights"
    size = f" {record['size']}" if record["size"] else ""
    return (f"{record['family']}{size} ({origin}): {d['n_layers']} layers, hidden {d['hidden_size']}, "
            f"{d['n_heads']} heads / {d['n_kv_heads']} KV heads x {d['head_dim']}, vocab {d['vocab_size']}, "
            f"max positions {d['max_position_embeddings']}, {record['n_params'] / 1e6:.2f}M params "
            f"{record.get('weights_form') or record['dtype']}")
