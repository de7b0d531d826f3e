"""What a checkpoint load returns: the model, its tokenizer, and a report of what was loaded and what it cost."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch

from fuelpipe.weights.tokenizer import TextTokenizer


@dataclass
class LoadReport:
    """What was loaded and what it cost. ``peak_rss_mb`` is the process's resident peak during the load."""

    source: Path
    format: str  # "gguf" | "safetensors"
    architecture: str
    family: str
    config: Any
    dtype: torch.dtype
    n_params: int = 0
    form: str = ""  # how the weights are held (fuelpipe.quant.modules.stored_form); "": as ``dtype``
    weights_mb: float = 0.0  # final parameter bytes at ``dtype``
    tensor_types: dict[str, int] = field(default_factory=dict)  # stored type -> tensor count
    timings_s: dict[str, float] = field(default_factory=dict)  # header / build / weights / tokenizer
    load_s: float = 0.0
    rss_before_mb: float = 0.0
    peak_rss_mb: float = 0.0
    peak_is_process_lifetime: bool = False  # True when the peak could not be reset before the load

    def summary(self) -> str:
        types = ", ".join(f"{k} x{v}" for k, v in sorted(self.tensor_types.items()))
        return (
            f"{self.source.name}: {self.family} ({self.architecture}, {self.format}) {self.n_params / 1e6:.1f}M params "
            f"as {self.form or str(self.dtype).removeprefix('torch.')} ({self.weights_mb:.0f} MB) in {self.load_s:.2f}s "
            f"[{', '.join(f'{k} {v:.2f}s' for k, v in self.timings_s.items())}]; peak RSS {self.peak_rss_mb:.0f} MB "
            f"(from {self.rss_before_mb:.0f} MB); tensors: {types}"
        )


class LoadedModel(NamedTuple):
    model: torch.nn.Module
    tokenizer: Optional[TextTokenizer]  # None when not requested, or an HF directory without tokenizer.json
    report: LoadReport
