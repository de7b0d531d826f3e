"""What each checkpoint architecture means for a registered family, as data, and how the loader finds it.

One ``Architecture`` per checkpoint architecture says:

* which registry family builds it,
* how to turn the checkpoint's own config (GGUF metadata, HF ``config.json``)
  into the family's config fields (read through ``config_readers``),
* for GGUF, how llama.cpp's tensor names map onto the family's parameter
  names and which tensors llama.cpp stored transformed (``gguf_transforms``).

HF safetensors need no name table: the families' parameter names follow the
HF checkpoints (``model.`` prefix aside), so only the config translation is
per architecture, plus, where a checkpoint stores one parameter as several
tensors (DeepSeek-V2's per-expert weights), an ``hf_state_transform`` that
says how they combine.

Each family declares its own architectures in ``models/<family>/checkpoint.py``
and lists them in its ``FamilyEntry.architectures``; the loader only looks
them up here (``by_gguf_arch``, ``by_hf_architecture``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

if TYPE_CHECKING:
    from fuelpipe.weights.config_readers import GgufConfigReader, HfConfigReader

Transform = Callable[[torch.Tensor, Any], torch.Tensor]  # (f32 tensor, family config) -> tensor


@dataclass(frozen=True)
class TensorRule:
    """``source`` (checkpoint name) -> ``target`` (parameter name); ``{i}`` stands for the layer index."""

    source: str
    target: str
    transform: Optional[Transform] = None


def linear_rules(src: str, dst: str, transform: Optional[Transform] = None) -> tuple[TensorRule, ...]:
    """The weight and bias rules of one linear layer (a rule whose tensor a file lacks is simply not used)."""
    return (TensorRule(f"{src}.weight", f"{dst}.weight", transform), TensorRule(f"{src}.bias", f"{dst}.bias", transform))


@dataclass(frozen=True)
class Combined:
    """One parameter that an HF checkpoint stores as several tensors (DeepSeek-V2: one per routed expert).

    ``name`` is what the whole tensor would be called in the checkpoint (it resolves to the parameter like
    any other name); ``combine`` receives the ``sources`` in order, each read, finiteness-checked and still
    in its stored dtype, and returns a tensor of ``shape``, checked against the parameter before any read.
    """

    name: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    combine: Callable[[list[torch.Tensor]], torch.Tensor]


# (checkpoint directory, family config, checkpoint tensor name -> shape) -> the parameters stored in parts.
# Raises a WeightsError naming the tensor when the parts are incomplete or do not belong to the model.
HfStateTransform = Callable[[Path, Any, dict[str, tuple[int, ...]]], tuple[Combined, ...]]


@dataclass(frozen=True)
class Architecture:
    family: str
    gguf_arch: Optional[str]  # general.architecture, None if GGUF files of it are not loaded
    hf_architectures: tuple[str, ...]
    config_from_gguf: Optional[Callable[[GgufConfigReader], dict]]
    config_from_hf: Callable[[HfConfigReader], dict]
    gguf_tensors: tuple[TensorRule, ...] = ()
    hf_state_transform: Optional[HfStateTransform] = None  # None: every HF tensor is one parameter


def registered_architectures() -> tuple[Architecture, ...]:
    """Every registered family's checkpoint architectures (built-in and installed)."""
    from models.registry import families

    return tuple(a for entry in families().values() for a in entry.architectures)


def by_gguf_arch() -> dict[str, Architecture]:
    return _unique("GGUF architecture", [(a.gguf_arch, a) for a in registered_architectures() if a.gguf_arch])


def by_hf_architecture() -> dict[str, Architecture]:
    return _unique("HF architecture", [(n, a) for a in registered_architectures() for n in a.hf_architectures])


def _unique(kind: str, pairs: list[tuple[str, Architecture]]) -> dict[str, Architecture]:
    """name -> architecture; two families claiming one checkpoint architecture is a typed clash."""
    from fuelpipe.registry import RegistrationClashError

    out: dict[str, Architecture] = {}
    for name, arch in pairs:
        if name in out and out[name] is not arch:
            raise RegistrationClashError(
                f"{kind} {name!r} is claimed by two families: {out[name].family!r} and {arch.family!r}")
        out[name] = arch
    return out
