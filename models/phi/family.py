"""Phi-3: fused qkv and gate_up, partial rotary, optional sliding window.

The family's registry entry, named by the ``fuelpipe.families`` entry point ``phi`` in pyproject.toml.
"""
from fuelpipe.family import FamilyEntry
from models.phi.checkpoint import PHI3_ARCHITECTURE
from models.phi.config import PhiConfig, phi3_mini_4k, phi_tiny
from models.phi.model import PhiModel
from models.phi.twin import PHI3_TWIN

FAMILY = FamilyEntry(
    "phi",
    PhiModel,
    {"tiny": phi_tiny, "phi3_mini_4k": phi3_mini_4k},
    config_cls=PhiConfig,
    architectures=(PHI3_ARCHITECTURE,),
    twin=PHI3_TWIN,
)
