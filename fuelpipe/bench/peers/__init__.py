"""The peers benchmark: fuelpipe against Hugging Face transformers, llama.cpp and the bandwidth floor."""
