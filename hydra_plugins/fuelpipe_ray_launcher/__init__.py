"""fuelpipe's Ray launcher for Hydra sweeps (``hydra/launcher=ray_cluster``); see ray_launcher.py."""
