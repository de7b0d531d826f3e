from models.phi.config import PhiConfig, phi3_mini_4k, phi_tiny
from models.phi.model import PhiModel

__all__ = ["PhiConfig", "PhiModel", "phi3_mini_4k", "phi_tiny"]
