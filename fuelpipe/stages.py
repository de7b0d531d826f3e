"""Experiment stages: each kind of study (peers, context scaling, ...) as one registered unit.

A stage owns, in one module:

* its config schema: a dataclass with an ``enabled: bool`` field, mounted at
  ``experiment.<name>`` (the schema is composed from the registered stages, see
  ``fuelpipe.config.schema.schema_class``);
* its validation: ``validate(section)`` returns reasons before anything loads
  (a bad value exits 2), ``check_loaded(section, asm)`` the ones that need the
  loaded model (its position limit, its tokenizer), still before anything runs;
* its run: ``run(section, cfg, asm, output_dirs)`` returns its ``results.json``
  section (stored under ``results_key``) and writes its tables and plots into
  ``output_dirs``;
* its rendering: ``render(section)`` is the Markdown that the run's summary and
  ``fuelpipe report`` print.

Stages come from ``fuelpipe.stages`` entry points (the built-ins are fuelpipe's
own) and from ``STAGES.register`` in-process before the config is composed.
The job runs every enabled stage in registration order; it has no per-kind branch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from fuelpipe.errors import ConfigError
from fuelpipe.registry import Registry


def _no_reasons(*_args) -> list[str]:
    return []


@dataclass(frozen=True)
class StageSpec:
    name: str  # the config section: experiment.<name>
    config_cls: type  # a dataclass with ``enabled: bool = False``
    run: Callable[[Any, Any, Any, list[Path]], dict]  # (section, cfg, asm, output_dirs) -> results section
    validate: Callable[[Any], list[str]] = _no_reasons  # (section) -> reasons; called only when enabled
    check_loaded: Callable[[Any, Any], list[str]] = _no_reasons  # (section, asm) -> reasons
    render: Optional[Callable[[dict], str]] = None  # results section -> Markdown
    results_key: str = ""  # the results.json key; "" = name
    progress_steps: Callable[[Any], int] = lambda section: 1  # for the progress bar

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.config_cls):
            raise ConfigError(f"stage {self.name!r}: config_cls must be a dataclass, got {self.config_cls!r}")
        fields = {f.name: f for f in dataclasses.fields(self.config_cls)}
        if "enabled" not in fields:
            raise ConfigError(f"stage {self.name!r}: {self.config_cls.__name__} needs an 'enabled: bool' field")
        if not self.results_key:
            object.__setattr__(self, "results_key", self.name)

    def enabled(self, exp) -> bool:
        return bool(exp[self.name].enabled)


STAGES: Registry[StageSpec] = Registry("fuelpipe.stages", "experiment stage", StageSpec)


def ordered_stages() -> list[StageSpec]:
    """Registered stages in a stable order (by name)."""
    return [STAGES.get(name) for name in STAGES]


def enabled_stages(exp) -> list[StageSpec]:
    return [s for s in ordered_stages() if s.enabled(exp)]


def stage_reasons(exp) -> list[str]:
    """Up-front reasons of every enabled stage, each prefixed by where it came from when it raised."""
    reasons: list[str] = []
    for stage in enabled_stages(exp):
        try:
            reasons += list(stage.validate(exp[stage.name]))
        except ConfigError as err:
            reasons.append(str(err))
    return reasons
