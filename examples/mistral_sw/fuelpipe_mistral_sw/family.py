"""The registry entry (``fuelpipe.families`` entry point ``mistral_sw``): model class, config class, sizes."""
from fuelpipe.family import FamilyEntry
from fuelpipe_mistral_sw.config import MistralSwConfig, mistral_sw_tiny
from fuelpipe_mistral_sw.model import MistralSwModel

FAMILY = FamilyEntry("mistral_sw", MistralSwModel, {"tiny": mistral_sw_tiny}, config_cls=MistralSwConfig)
