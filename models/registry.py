"""Family and named-size lookups: the one place the framework looks a family up by name.

Families come from the ``fuelpipe.families`` entry points (the five built-ins
are entry points of fuelpipe itself, see ``pyproject.toml``) and from
``register_family`` in-process. A family registers its model class and its
named config builders. Builders take every number as an argument
(``LlamaConfig(...)``); named builders only fill in numbers (``llama_tiny()``).
"""
from __future__ import annotations

import numbers

import torch

from fuelpipe.errors import ConfigError
from fuelpipe.family import FamilyEntry
from fuelpipe.random_init import randomize
from fuelpipe.registry import Registry, did_you_mean
from models.overrides import checked_overrides

__all__ = ["FAMILIES", "FamilyEntry", "build_config", "build_random_model", "did_you_mean", "families", "family",
           "register_family"]

FAMILIES: Registry[FamilyEntry] = Registry("fuelpipe.families", "model family", FamilyEntry)


def register_family(entry: FamilyEntry) -> FamilyEntry:
    """Register a family in-process (an installed package uses a ``fuelpipe.families`` entry point)."""
    return FAMILIES.register(entry)


def families() -> dict[str, FamilyEntry]:
    return FAMILIES.entries()


def family(name: str) -> FamilyEntry:
    fams = families()
    if not isinstance(name, str):
        raise ConfigError(f"a model family is named by a string, got {type(name).__name__} {name!r}; "
                          f"available: {', '.join(sorted(fams))}")
    if name not in fams:
        raise ConfigError(did_you_mean("model family", name, fams))
    return fams[name]


def build_config(family_name: str, size: str, **overrides):
    entry = family(family_name)
    if not isinstance(size, str):
        raise ConfigError(f"a {family_name} size is named by a string, got {type(size).__name__} {size!r}; "
                          f"available: {', '.join(sorted(entry.sizes))}")
    if size not in entry.sizes:
        raise ConfigError(did_you_mean(f"{family_name} size", size, entry.sizes))
    if entry.config_cls is not None:
        overrides = checked_overrides(entry.config_cls, overrides, f"{family_name} config")
    try:
        return entry.sizes[size](**overrides)
    except TypeError as e:  # a builder whose family declares no config class
        raise ConfigError(f"{family_name} {size}: {e}") from None


def build_random_model(family_name: str, size: str, *, seed: int = 0, dtype=torch.float32, device="cpu", **overrides):
    """A model of a named size with deterministic random weights (tests, benchmarks)."""
    config = build_config(family_name, size, **overrides)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(
            f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device {device!r} is not a torch device: {e}") from None
    model = family(family_name).model_cls(config, device=device, dtype=dtype)
    return randomize(model, seed=seed)
