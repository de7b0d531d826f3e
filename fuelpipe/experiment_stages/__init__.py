"""fuelpipe's own experiment stages: every module here that defines ``STAGE`` is one.

Adding a built-in kind of experiment is one new module in this package (its
config dataclass, validation, run and rendering: see ``fuelpipe.stages``) plus
its ``conf/experiment/<name>.yaml``. The ``fuelpipe.stages`` entry point
``builtin`` names ``BUILTIN_STAGES``; installed packages add their own stages
through the same entry-point group.
"""
from __future__ import annotations

import importlib
import pkgutil

from fuelpipe.stages import StageSpec


def _discover() -> tuple[StageSpec, ...]:
    stages = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        stage = getattr(module, "STAGE", None)
        if isinstance(stage, StageSpec):
            stages.append(stage)
    return tuple(stages)


BUILTIN_STAGES = _discover()
