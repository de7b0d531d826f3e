"""DeepSeek-V2: multi-head latent attention (latent KV) and routed experts.

The family's registry entry, named by the ``fuelpipe.families`` entry point ``deepseek_v2`` in pyproject.toml.
"""
from fuelpipe.family import FamilyEntry
from models.deepseek_v2.checkpoint import DEEPSEEK_V2_ARCHITECTURE
from models.deepseek_v2.config import DeepseekV2Config, deepseek_v2_tiny, deepseek_v2_tiny_dense
from models.deepseek_v2.model import DeepseekV2Model
from models.deepseek_v2.twin import DEEPSEEK_V2_TWIN

FAMILY = FamilyEntry(
    "deepseek_v2",
    DeepseekV2Model,
    {"tiny": deepseek_v2_tiny, "tiny_dense": deepseek_v2_tiny_dense},
    is_mla=True,
    config_cls=DeepseekV2Config,
    architectures=(DEEPSEEK_V2_ARCHITECTURE,),
    twin=DEEPSEEK_V2_TWIN,
)
