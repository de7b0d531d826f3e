"""Gemma 3: interleaved sliding/global layers with two RoPE bases, sandwich norms, softcapping.

The family's registry entry, named by the ``fuelpipe.families`` entry point ``gemma3`` in pyproject.toml.
"""
from fuelpipe.family import FamilyEntry
from models.gemma3.checkpoint import GEMMA3_ARCHITECTURE
from models.gemma3.config import Gemma3Config, gemma3_1b, gemma3_tiny
from models.gemma3.model import Gemma3Model
from models.gemma3.twin import GEMMA3_TWIN

FAMILY = FamilyEntry(
    "gemma3",
    Gemma3Model,
    {"tiny": gemma3_tiny, "gemma3_1b": gemma3_1b},
    config_cls=Gemma3Config,
    architectures=(GEMMA3_ARCHITECTURE,),
    twin=GEMMA3_TWIN,
)
