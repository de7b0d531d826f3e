"""A Mistral-style family for fuelpipe, kept out of tree: it registers through entry points only."""
from fuelpipe_mistral_sw.config import MistralSwConfig, mistral_sw_tiny
from fuelpipe_mistral_sw.model import MistralSwModel

__all__ = ["MistralSwConfig", "MistralSwModel", "mistral_sw_tiny"]
