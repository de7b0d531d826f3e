"""Typed reads of a checkpoint's own config: GGUF metadata and HF ``config.json``.

A family's checkpoint translation (``models/<family>/checkpoint.py``) reads
its config fields through these; a missing required key or a value of the
wrong type is a ``CheckpointConfigError`` naming the file and the key, never
a silent coercion. RoPE scaling, whose spelling differs across transformers
versions and llama.cpp, is read here once for every family.
"""
from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any, Optional

from fuelpipe.rope import YARN_DEFAULTS, RopeScaling
from fuelpipe.weights.errors import CheckpointConfigError

_MISSING = object()


class _TypedValues:
    """Typed reads on top of ``req``/``opt``: a value of the wrong type is refused, never coerced.

    ``int(64.5)`` would silently truncate and ``bool("false")`` is True; these name the key and the value.
    """

    path: Path

    def req(self, key: str) -> Any: ...  # supplied by the reader
    def opt(self, key: str, default: Any = None) -> Any: ...
    def key_name(self, key: str) -> str: ...

    def _get(self, key: str, default: Any) -> Any:
        return self.req(key) if default is _MISSING else self.opt(key, default)

    def _bad(self, key: str, value: Any, want: str) -> CheckpointConfigError:
        return CheckpointConfigError(self.path, f"{self.key_name(key)}={value!r} must be {want}")

    def int_(self, key: str, default: Any = _MISSING) -> Any:
        """An integer (an integral float such as 64.0 is accepted); ``default`` may be None."""
        value = self._get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
                not isinstance(value, numbers.Integral) and not float(value).is_integer()):
            raise self._bad(key, value, "an integer")
        return int(value)

    def float_(self, key: str, default: Any = _MISSING) -> Any:
        """A finite number; ``default`` may be None."""
        value = self._get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise self._bad(key, value, "a finite number")
        return float(value)

    def bool_(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value


class GgufConfigReader(_TypedValues):
    """``{arch}.*`` metadata of one GGUF file; a missing required key names the file and the key."""

    def __init__(self, path: Path, arch: str, metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]):
        self.path, self.arch, self.metadata, self.tensor_shapes = path, arch, metadata, tensor_shapes

    def req(self, key: str) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.metadata:
            raise CheckpointConfigError(self.path, f"GGUF metadata key {full!r} is missing")
        return self.metadata[full]

    def opt(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    def key_name(self, key: str) -> str:
        return f"GGUF metadata {self.arch}.{key}"

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes

    def rows(self, name: str) -> int:
        if name not in self.tensor_shapes:
            raise CheckpointConfigError(self.path, f"tensor {name!r} is missing, so its size cannot be read")
        return self.tensor_shapes[name][0]

    def rope_scaling(self) -> RopeScaling:
        kind = self.opt("rope.scaling.type", "none")
        if kind == "none":
            return RopeScaling()
        if kind == "linear":
            return RopeScaling("linear", self.float_("rope.scaling.factor"))
        raise CheckpointConfigError(
            self.path, f"GGUF rope scaling type {kind!r} ({self.arch}.rope.scaling.type) is not supported; "
            "supported: none, linear"
        )


class HfConfigReader(_TypedValues):
    """A ``config.json`` dict; a missing required key names the file and the key."""

    def __init__(self, path: Path, cfg: dict[str, Any], prefix: str = ""):
        if not isinstance(cfg, dict):
            raise CheckpointConfigError(path, f"config.json {prefix.rstrip('.') or 'top level'} must be an object, "
                                              f"got {type(cfg).__name__} {cfg!r}")
        self.path, self.cfg, self.prefix = path, cfg, prefix  # prefix: where a nested object sits ("rope_scaling.")

    def req(self, key: str) -> Any:
        if self.cfg.get(key) is None:
            raise CheckpointConfigError(self.path, f"config.json has no {self.prefix + key!r}")
        return self.cfg[key]

    def opt(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def key_name(self, key: str) -> str:
        return f"config.json {self.prefix}{key}"

    def rope(self, default_theta: float = 10000.0) -> tuple[float, RopeScaling]:
        """(rope_theta, scaling) from either the transformers-4 keys or transformers-5 ``rope_parameters``."""
        params = HfConfigReader(self.path, self.cfg.get("rope_parameters") or {}, "rope_parameters.")
        which = "rope_scaling" if self.cfg.get("rope_scaling") else "rope_parameters"
        scaling = HfConfigReader(self.path, self.cfg.get("rope_scaling") or params.cfg, which + ".")
        theta = self.float_("rope_theta", params.float_("rope_theta", default_theta))
        kind = scaling.opt("rope_type", scaling.opt("type", "default"))
        if kind == "default":
            return theta, RopeScaling()
        if kind == "linear":
            return theta, RopeScaling("linear", scaling.float_("factor"))
        if kind == "llama3":
            return theta, RopeScaling(
                "llama3", scaling.float_("factor"), scaling.float_("low_freq_factor"),
                scaling.float_("high_freq_factor"), scaling.int_("original_max_position_embeddings"),
            )
        if kind == "yarn":
            return theta, scaling.yarn(self.int_("max_position_embeddings", None))
        raise CheckpointConfigError(
            self.path, f"rope scaling type {kind!r} is not supported; supported: default, linear, llama3, yarn"
        )

    def yarn(self, max_position_embeddings: Optional[int]) -> RopeScaling:
        """A YaRN entry (this reader holds the scaling object). Absent or null fields take transformers' defaults;
        an absent factor is the context's stretch, max_position_embeddings / original_max_position_embeddings."""
        original = self.int_("original_max_position_embeddings")
        factor = self.float_("factor", None)
        if factor is None:
            if max_position_embeddings is None:
                raise CheckpointConfigError(self.path, f"{self.key_name('factor')} is missing and there is no "
                                                       "max_position_embeddings to derive it from")
            factor = max_position_embeddings / original
        d = YARN_DEFAULTS
        return RopeScaling(
            "yarn", factor, original_max_position_embeddings=original,
            beta_fast=self.float_("beta_fast", d["beta_fast"]), beta_slow=self.float_("beta_slow", d["beta_slow"]),
            mscale=self.float_("mscale", d["mscale"]),
            mscale_all_dim=self.float_("mscale_all_dim", d["mscale_all_dim"]),
            attention_factor=self.float_("attention_factor", None), truncate=self.bool_("truncate", d["truncate"]),
        )

    def decoder_geometry(self) -> dict[str, int]:
        """The sizes every dense decoder's config.json spells alike; ``num_key_value_heads`` defaults to the heads."""
        heads = self.int_("num_attention_heads")
        return dict(
            vocab_size=self.int_("vocab_size"),
            hidden_size=self.int_("hidden_size"),
            intermediate_size=self.int_("intermediate_size"),
            num_hidden_layers=self.int_("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=self.int_("num_key_value_heads", heads),
        )

    def require_activation(self, key: str, allowed: tuple[str, ...]) -> None:
        act = self.opt(key, allowed[0])
        if act not in allowed:
            raise CheckpointConfigError(self.path, f"config.json {key}={act!r} is not supported; expected one of {allowed}")
