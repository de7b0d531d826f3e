"""Base class for model families: instance identity and the shape key come for free.

Weight identity is not kept here: a held plan reads it from the tensors
themselves on every step (``fuelpipe.plan.weights_identity``), because any
bookkeeping kept on the model (hooks, epochs) is bypassed by ``param.data =``
or a deep copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from torch import nn

from fuelpipe.errors import ConfigError
from fuelpipe.identity import ModelInstanceId, shape_key, structure_fields


class DecoderModel(nn.Module):
    """Common identity plumbing. A subclass sets ``family``, ``config``, ``rope_fields`` and the plans."""

    family: str = ""
    rope_fields: tuple[str, ...] = ()
    offset_mode: str = "tensor"
    # Trailing shapes of the per-layer latent KV slots for MLA families; None = K/V heads cache.
    latent_slots: tuple[tuple[int, ...], ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        # Minted per constructed model, never recycled: a plan built for this model
        # can never be judged valid for another one, whatever the allocator does.
        self.instance_id = ModelInstanceId.mint()
        self._shape_key: tuple[Any, int] | None = None  # (config it was computed for, key)
        # How the matrix weights are held (fuelpipe.quant.QuantSpec); None: as built (model dtype).
        self.weight_format = None

    def set_weight_format(self, spec) -> None:
        """Stamp the quantization the matrices were converted to (it enters the plan key)."""
        self.weight_format = spec
        self._shape_key = None

    def __setstate__(self, state: dict) -> None:
        # copy.copy, copy.deepcopy and unpickling all land here: the result is another
        # model instance, so it gets an id of its own (and a shape key computed anew).
        super().__setstate__(state)
        self.instance_id = ModelInstanceId.mint()
        self._shape_key = None
        self.__dict__.setdefault("weight_format", None)

    def structure(self) -> dict[str, Any]:
        """Every structure-affecting config field (RoPE fields excluded: per-token data)."""
        out = structure_fields(self.config, self.rope_fields)
        fmt = getattr(self, "weight_format", None)
        out["weight_format"] = "as_built" if fmt is None else fmt.label()
        return out

    def shape_key(self) -> int:
        cached = self._shape_key
        if cached is None or cached[0] is not self.config:  # a replaced config is a new structure
            cached = self._shape_key = (self.config, shape_key(self.family, self.structure(), self.instance_id))
        return cached[1]


@dataclass(frozen=True)
class TransformersTwin:
    """How a family's config becomes a Hugging Face transformers model (the ``vs_transformers`` reference).

    ``config`` builds the transformers config from the family's config *inputs*
    (it is called with the transformers module, imported only when a twin is
    built); ``architecture`` is the transformers class name, as config.json's
    ``architectures`` lists it. ``fuelpipe.oracles.hf_twin`` builds and loads the twin.
    """

    config: Callable[[Any, Any], Any]  # (fuelpipe config, transformers module) -> transformers config
    architecture: str


@dataclass(frozen=True)
class FamilyEntry:
    """A model family as the registry knows it (``fuelpipe.families`` entry points).

    ``sizes`` maps a size name to a builder that only fills in numbers
    (``llama_tiny(**overrides)``); ``config_cls`` is the config dataclass
    (checkpoint loaders build it from file metadata, and overrides are checked
    against its fields); ``architectures`` say which checkpoint architectures
    (GGUF ``general.architecture``, HF ``architectures``) this family loads and
    how their names map onto its parameters; ``twin`` says how transformers
    builds the same model (None: the family has no transformers twin, and
    ``vs_transformers`` skips it saying so).
    """

    name: str
    model_cls: type
    sizes: Mapping[str, Callable[..., object]]
    is_mla: bool = False
    config_cls: type | None = None
    architectures: tuple = ()  # fuelpipe.weights.architectures.Architecture, one per checkpoint architecture
    twin: Optional[TransformersTwin] = None

    def __post_init__(self) -> None:
        if not isinstance(self.model_cls, type):
            raise ConfigError(f"family {self.name!r}: model_cls must be a class, got {self.model_cls!r}")
        if not self.sizes:
            raise ConfigError(f"family {self.name!r} names no sizes; give at least one builder (e.g. 'tiny')")
        if self.twin is not None and not isinstance(self.twin, TransformersTwin):
            raise ConfigError(f"family {self.name!r}: twin must be a fuelpipe.family.TransformersTwin, "
                              f"got {type(self.twin).__name__} {self.twin!r}")
        for arch in self.architectures:
            if getattr(arch, "family", self.name) != self.name:
                raise ConfigError(f"family {self.name!r} lists an architecture of family {arch.family!r}")
