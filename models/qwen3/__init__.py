from models.qwen3.config import Qwen3Config, qwen3_0_6b, qwen3_tiny
from models.qwen3.model import Qwen3Model

__all__ = ["Qwen3Config", "Qwen3Model", "qwen3_0_6b", "qwen3_tiny"]
