"""Which dotted keys the schema knows, with a did-you-mean for the ones it does not.

Hydra's ``+key=value`` opens even a structured node for writing, so an added
misspelled key would otherwise ride along unused. Both the command-line
preflight and ``validate()`` ask this module.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig

from fuelpipe.config.schema import schema_class
from models.registry import did_you_mean


def schema_key_problem(dotted: str) -> Optional[str]:
    """Why ``dotted`` is not a key of the schema, or None.

    Any name is allowed as the key of a Dict field (oracle names are checked
    by validate()); below a Dict of dataclasses (experiment.oracles.<name>)
    the walk continues into the dataclass.
    """
    node: Any = schema_class()
    walked: list[str] = []
    for part in dotted.split("."):
        if isinstance(node, _DictOf):
            node = node.value
        elif dataclasses.is_dataclass(node):
            fields = {f.name for f in dataclasses.fields(node)}
            if part not in fields:
                return did_you_mean(f"key in {'.'.join(walked) or 'the root config'}", part, fields)
            node = _field_type(node, part)
        else:
            return None  # below a plain value, or a Dict of plain values (model.overrides)
        walked.append(part)
    return None


@dataclass(frozen=True)
class _DictOf:
    value: type  # the dataclass each Dict entry holds


def _field_type(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    if dataclasses.is_dataclass(hint):
        return hint
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return _DictOf(args[1])
    return None


def unknown_keys(cfg: DictConfig) -> list[str]:
    """A reason for every key of ``cfg`` the schema does not define."""
    reasons = []
    for path in _paths(cfg, ""):
        problem = schema_key_problem(path)
        if problem:
            reasons.append(problem)
    return reasons


def _paths(node: DictConfig, prefix: str):
    for key in node:
        path = f"{prefix}{key}"
        if path == "hydra":
            continue  # Hydra's own node (present when composed with return_hydra_config)
        yield path
        if isinstance(node[key], DictConfig):
            yield from _paths(node[key], path + ".")
