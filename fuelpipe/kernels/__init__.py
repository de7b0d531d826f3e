"""Compiled operators (quantized GEMVs), built once per machine on first use: see ``build``."""
