"""Load real checkpoints, offline (GGUF files, HF safetensors directories)."""
