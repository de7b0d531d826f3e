"""Config groups shipped by installed packages: each ``fuelpipe.conf`` entry point joins Hydra's search path.

An extension package that adds a family ships its ``model/<name>.yaml`` (and any
other group options) inside a Python package, and names that package in a
``fuelpipe.conf`` entry point, for example::

    [project.entry-points."fuelpipe.conf"]
    mistral_sw = "fuelpipe_mistral_sw.conf"

Then ``python -m fuelpipe model=<name>`` composes it with nothing else to do.
The packages' folders are searched after fuelpipe's own ``conf/``, so an
extension adds options and never silently replaces a built-in one (a clash is
reported by ``fuelpipe.config.preflight``).
"""
from __future__ import annotations

import importlib.util
from importlib import metadata

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

GROUP = "fuelpipe.conf"


class FuelpipeConfSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.value):
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            if importlib.util.find_spec(ep.value) is None:
                from fuelpipe.registry import ExtensionLoadError

                raise ExtensionLoadError(
                    f"entry point {ep.name!r} of group {GROUP!r} from distribution {dist!r} names the package "
                    f"{ep.value!r}, which cannot be imported")
            search_path.append(provider=f"{GROUP}:{dist}", path=f"pkg://{ep.value}")
