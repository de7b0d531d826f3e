"""Llama (SmolLM2): GQA, RoPE (llama3 scaling), SwiGLU, tied or untied head.

The family's registry entry, named by the ``fuelpipe.families`` entry point ``llama`` in pyproject.toml.
"""
from fuelpipe.family import FamilyEntry
from models.llama.checkpoint import LLAMA_ARCHITECTURE
from models.llama.config import LlamaConfig, llama_tiny, smollm2_135m
from models.llama.model import LlamaModel
from models.llama.twin import LLAMA_TWIN

FAMILY = FamilyEntry(
    "llama",
    LlamaModel,
    {"tiny": llama_tiny, "smollm2_135m": smollm2_135m},
    config_cls=LlamaConfig,
    architectures=(LLAMA_ARCHITECTURE,),
    twin=LLAMA_TWIN,
)
