from models.deepseek_v2.config import DeepseekV2Config, deepseek_v2_tiny, deepseek_v2_tiny_dense
from models.deepseek_v2.model import DeepseekV2Model

__all__ = ["DeepseekV2Config", "DeepseekV2Model", "deepseek_v2_tiny", "deepseek_v2_tiny_dense"]
