"""Family and named-size registry: the one place the framework looks a family up by name.

A family registers its model class and its named config builders. Builders
take every number as an argument (``LlamaConfig(...)``); named builders only
fill in numbers (``llama_tiny()``).
"""
from __future__ import annotations

import difflib
import numbers
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from fuelpipe.errors import ConfigError
from fuelpipe.random_init import randomize
from models.overrides import checked_overrides


@dataclass(frozen=True)
class FamilyEntry:
    name: str
    model_cls: type
    sizes: dict[str, Callable[..., object]]
    is_mla: bool = False
    config_cls: type | None = None  # the config dataclass; checkpoint loaders build it from file metadata


_FAMILIES: dict[str, FamilyEntry] = {}


def register_family(entry: FamilyEntry) -> None:
    if entry.name in _FAMILIES:
        raise ConfigError(f"family {entry.name!r} is already registered")
    _FAMILIES[entry.name] = entry


def did_you_mean(kind: str, name: str, available) -> str:
    options = sorted(available)
    close = difflib.get_close_matches(name, options, n=1)
    hint = f" did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r};{hint} available: {', '.join(options)}"


def families() -> dict[str, FamilyEntry]:
    _load_builtin()
    return dict(_FAMILIES)


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


_loaded = False
_load_lock = threading.Lock()


def _load_builtin() -> None:
    global _loaded
    with _load_lock:  # registration must finish before any thread reads the registry
        if _loaded:
            return
        _register_builtin()
        _loaded = True


def _register_builtin() -> None:
    import models.deepseek_v2 as deepseek_v2
    import models.gemma3 as gemma3
    import models.llama as llama
    import models.phi as phi
    import models.qwen3 as qwen3

    register_family(FamilyEntry("llama", llama.LlamaModel, {"tiny": llama.llama_tiny, "smollm2_135m": llama.smollm2_135m},
                                config_cls=llama.LlamaConfig))
    register_family(FamilyEntry("phi", phi.PhiModel, {"tiny": phi.phi_tiny, "phi3_mini_4k": phi.phi3_mini_4k},
                                config_cls=phi.PhiConfig))
    register_family(FamilyEntry("qwen3", qwen3.Qwen3Model, {"tiny": qwen3.qwen3_tiny, "qwen3_0_6b": qwen3.qwen3_0_6b},
                                config_cls=qwen3.Qwen3Config))
    register_family(FamilyEntry("gemma3", gemma3.Gemma3Model, {"tiny": gemma3.gemma3_tiny, "gemma3_1b": gemma3.gemma3_1b},
                                config_cls=gemma3.Gemma3Config))
    register_family(
        FamilyEntry(
            "deepseek_v2",
            deepseek_v2.DeepseekV2Model,
            {"tiny": deepseek_v2.deepseek_v2_tiny, "tiny_dense": deepseek_v2.deepseek_v2_tiny_dense},
            is_mla=True,
            config_cls=deepseek_v2.DeepseekV2Config,
        )
    )
