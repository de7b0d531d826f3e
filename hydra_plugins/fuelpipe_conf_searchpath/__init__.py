"""Hydra finds this plugin by scanning the ``hydra_plugins`` namespace package (see searchpath.py)."""
