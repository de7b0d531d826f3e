"""Text in, text out: ``load`` a checkpoint, then ``generate``, ``chat`` or ``stream`` strings."""
from fuelpipe.api.text_model import Completion, TextModel, load

__all__ = ["Completion", "TextModel", "load"]
