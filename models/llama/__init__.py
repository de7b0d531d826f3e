from models.llama.config import LlamaConfig, llama_tiny, smollm2_135m
from models.llama.model import LlamaModel

__all__ = ["LlamaConfig", "LlamaModel", "llama_tiny", "smollm2_135m"]
