"""From a checkpoint's architecture to its family's model on the meta device (parameters without storage).

The family is looked up in the registry, the checkpoint's own config is
translated into the family's config (a malformed value is a typed refusal),
and the model is built on ``meta`` with random init skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from fuelpipe.errors import ConfigError
from fuelpipe.family import FamilyEntry
from fuelpipe.weights.architectures import Architecture
from fuelpipe.weights.errors import CheckpointConfigError, UnknownArchitectureError, WeightsError
from models.registry import family


def family_of(path: Path, arch: Architecture, arch_name: str) -> FamilyEntry:
    """The registered family that builds ``arch``; refused by name when it is not registered."""
    try:
        entry = family(arch.family)
    except ConfigError as e:
        raise UnknownArchitectureError(path, f"architecture {arch_name!r} needs the model family "
                                             f"{arch.family!r}, which is not registered ({e})") from None
    if entry.config_cls is None:
        raise UnknownArchitectureError(path, f"family {arch.family!r} does not declare its config class")
    return entry


def read_config(path: Path, read: Callable[[], dict], what: str) -> dict:
    """The family config fields a checkpoint's own config describes; a malformed value is a typed refusal."""
    try:
        return read()
    except WeightsError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # a value of the wrong shape or type
        raise CheckpointConfigError(path, f"{what} holds an invalid value ({type(e).__name__}: {e})") from None


def build_config(path: Path, entry: FamilyEntry, kwargs: dict):
    try:
        return entry.config_cls(**kwargs)
    except (ConfigError, TypeError) as e:
        raise CheckpointConfigError(path, f"the checkpoint's config does not make a valid {entry.name} config: {e}") from None


class _SkipMetaInit(TorchFunctionMode):
    """Random init of a meta tensor writes nothing, so skip it.

    Scoped to the meta build. Worth it: ``normal_`` on meta (``nn.Embedding``'s init) runs the
    Python reference kernel, whose first call imports sympy and ~800 modules, 2.3 s of a 4.5 s load.
    """

    _INIT = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_,
             nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.kaiming_uniform_,
             nn.init.kaiming_normal_, nn.init.xavier_uniform_, nn.init.xavier_normal_, nn.init.zeros_,
             nn.init.ones_, nn.init.constant_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._INIT:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def meta_model(entry: FamilyEntry, config, dtype: torch.dtype) -> torch.nn.Module:
    with _SkipMetaInit():
        return entry.model_cls(config, device="meta", dtype=dtype)  # parameters without storage
