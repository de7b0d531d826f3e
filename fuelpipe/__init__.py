"""fuelpipe: plan-once LLM decoding in PyTorch, with the oracles that prove it is still right."""
__version__ = "0.1.0"
