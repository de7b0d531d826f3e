"""Low-bit weights as a plan-time choice (``weights.dtype``): formats, GGUF blocks, modules."""
