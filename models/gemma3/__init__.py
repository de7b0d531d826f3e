from models.gemma3.config import Gemma3Config, gemma3_1b, gemma3_tiny
from models.gemma3.model import Gemma3Model

__all__ = ["Gemma3Config", "Gemma3Model", "gemma3_1b", "gemma3_tiny"]
