"""Qwen3: q/k norms, optional per-layer sliding windows.

The family's registry entry, named by the ``fuelpipe.families`` entry point ``qwen3`` in pyproject.toml.
"""
from fuelpipe.family import FamilyEntry
from models.qwen3.checkpoint import QWEN3_ARCHITECTURE
from models.qwen3.config import Qwen3Config, qwen3_0_6b, qwen3_tiny
from models.qwen3.model import Qwen3Model
from models.qwen3.twin import QWEN3_TWIN

FAMILY = FamilyEntry(
    "qwen3",
    Qwen3Model,
    {"tiny": qwen3_tiny, "qwen3_0_6b": qwen3_0_6b},
    config_cls=Qwen3Config,
    architectures=(QWEN3_ARCHITECTURE,),
    twin=QWEN3_TWIN,
)
