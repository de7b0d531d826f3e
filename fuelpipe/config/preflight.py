"""Check a command line before Hydra runs anything: a typo must never run something else.

Hydra itself stops on an unknown group option or key, but with exit code 1,
the code of a failed oracle. This check composes the command line the way
Hydra will (for a sweep: every group option named, and one representative
combination) and returns the problems, so the CLI can exit 2 naming them.
It also resolves the output directory once, so the CLI knows where the run
will write results.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fuelpipe.config.paths import conf_dir
from fuelpipe.config.schema import register_configs
from fuelpipe.config.keys import schema_key_problem
from fuelpipe.config.override_text import parse_problems, quoting_hint
from models.registry import did_you_mean

VERSION_BASE = "1.3"


@dataclass(frozen=True)
class Preflight:
    problems: list[str]
    multirun: bool
    output_dir: Optional[str]  # hydra.run.dir, or hydra.sweep.dir for a sweep; resolved


def preflight(
    overrides: Sequence[str],
    *,
    config_name: str = "config",
    config_dir: Optional[str] = None,
    multirun: bool = False,
) -> Preflight:
    register_configs()  # the schema holds every stage registered by now
    overrides = list(overrides)
    primary_dir = conf_dir()
    if config_dir:
        # Like Hydra's --config-dir: the primary config may live there, with conf/ still searched.
        overrides.append(f"hydra.searchpath=[file://{primary_dir}]")
        primary_dir = Path(config_dir).resolve()
    with initialize_config_dir(str(primary_dir), version_base=VERSION_BASE, job_name="fuelpipe"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        try:
            parsed = parser.parse_overrides(overrides)
        except HydraException as err:
            return Preflight(parse_problems(overrides, parser.parse_override) or [_message(err)], multirun, None)
        options = _GroupOptions(config_name, [o.input_line for o in parsed if o.key_or_group == "hydra.searchpath"])
        problems = _group_problems(parsed, options) + _key_problems(parsed, options)
        if problems:
            return Preflight(problems, multirun, None)
        cfg, problem = _compose(config_name, parsed)
        if problem:
            return Preflight([problem], multirun, None)
        multirun = multirun or cfg.hydra.mode == RunMode.MULTIRUN
        problems = ([] if multirun else _sweep_problems(parsed)) + _interpolation_problems(cfg, parsed)
        if problems:
            return Preflight(problems, multirun, None)
        if multirun and cfg.hydra.sweeper.get("params"):
            # Sweep axes set in a config (hydra.sweeper.params): checked like command-line ones,
            # which take precedence over them.
            given = {o.key_or_group for o in parsed}
            extra = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items() if k not in given]
            parsed += parser.parse_overrides(extra)
            problems = _group_problems(parsed, options) + _key_problems(parsed, options)
            if problems:
                return Preflight(problems, multirun, None)
            cfg, problem = _compose(config_name, parsed)
            if problem:
                return Preflight([problem], multirun, None)
        return Preflight([], multirun, str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))


class _GroupOptions:
    """The options of a config group, searched where the run will search (hydra.searchpath included).

    The search repository is built once per command line (building it loads the primary config: about
    0.1 s, which a call per override made seconds) and each group's answer is kept.
    """

    def __init__(self, config_name: str, searchpath_overrides: list[str]):
        self.config_name = config_name
        self.searchpath_overrides = searchpath_overrides
        self._repo = None
        self._options: dict[str, list[str]] = {}

    def __call__(self, group: str) -> list[str]:
        if group not in self._options:
            self._options[group] = self._lookup(group)
        return self._options[group]

    def _lookup(self, group: str) -> list[str]:
        loader = GlobalHydra.instance().config_loader()
        try:
            if self._repo is None and hasattr(loader, "_parse_overrides_and_create_caching_repo"):
                _, self._repo = loader._parse_overrides_and_create_caching_repo(
                    self.config_name, self.searchpath_overrides)
            if self._repo is not None:
                return self._repo.get_group_options(group, ObjectType.CONFIG)
            return loader.get_group_options(group, config_name=self.config_name, overrides=self.searchpath_overrides)
        except HydraException:
            return []  # the primary config itself is missing: compose reports that


def _group_problems(parsed: list[Override], group_options: _GroupOptions) -> list[str]:
    problems = []
    for override in parsed:
        if override.is_delete():
            continue
        options = group_options(override.key_or_group)
        if not options:
            continue  # a value override, not a group choice
        for value in _values(override):
            if value not in options:
                problems.append(did_you_mean(f"option for config group {override.key_or_group!r}", value, options))
    return problems


def _key_problems(parsed: list[Override], group_options: _GroupOptions) -> list[str]:
    """Dotted keys checked against the schema, so a misspelled key names its nearest neighbour."""
    problems = []
    for override in parsed:
        key = override.key_or_group
        if key.split(".")[0] == "hydra" or "/" in key or group_options(key):
            continue  # Hydra's own keys and group choices are checked elsewhere
        problem = schema_key_problem(key)
        if problem:
            problems.append(problem)
    return problems


def _sweep_problems(parsed: list[Override]) -> list[str]:
    """A sweep in a run that is not one (Hydra stops there with exit 1): often a comma in a text value."""
    problems = []
    for o in parsed:
        if o.is_sweep_override():
            key, _, value = o.input_line.partition("=")
            values = _values(o)
            problems.append(f"{o.input_line!r} is a sweep over {len(values)} values {values}, but this run is not a "
                            f"sweep (add -m to sweep over them)\n  {quoting_hint(key, value)}")
    return problems


def _interpolation_problems(cfg: DictConfig, parsed: list[Override]) -> list[str]:
    """A value typed with ``${...}`` that does not resolve (a missing key): named before the run resolves it."""
    problems = []
    for o in parsed:
        key = o.key_or_group
        if key.split(".")[0] == "hydra" or "${hydra:" in o.input_line or o.is_delete() or "${" not in o.input_line:
            continue
        try:
            OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as err:
            typed_key, _, value = o.input_line.partition("=")
            problems.append(f"{o.input_line!r} does not resolve: {str(err).splitlines()[0]}\n  "
                            f"{quoting_hint(typed_key, value)}")
    return problems


def _values(override: Override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _compose(config_name: str, parsed: list[Override]) -> tuple[Optional[DictConfig], Optional[str]]:
    """Compose one representative combination (the first value of every sweep)."""
    representative = [
        f"{o.get_key_element()}={_values(o)[0]}" if o.is_sweep_override() else o.input_line for o in parsed
    ]
    try:
        return compose(config_name, overrides=representative, return_hydra_config=True), None
    except (HydraException, OmegaConfBaseException) as err:
        return None, _message(err)


def _message(err: Exception) -> str:
    text = str(err).split("\nConfig search path:")[0].strip()
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException):
        text += f" ({str(cause).splitlines()[0]})"
    return text
