"""The config tree's schema, its location, and the up-front validation of a combination."""
from fuelpipe.config.paths import conf_dir
from fuelpipe.config.schema import FuelpipeConfig, register_configs

register_configs()

__all__ = ["FuelpipeConfig", "conf_dir", "register_configs"]
