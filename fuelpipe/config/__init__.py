"""The config tree's schema, its location, and the up-front validation of a combination."""
from fuelpipe.config.paths import conf_dir
from fuelpipe.config.schema import FuelpipeConfig, register_configs
from fuelpipe.errors import ConfigError

try:
    register_configs()
except ConfigError:
    # A broken or clashing installed extension: importing fuelpipe must still work; the error is
    # raised again, typed, where a configuration is composed (the CLI's preflight: exit 2).
    pass

__all__ = ["FuelpipeConfig", "conf_dir", "register_configs"]
