"""Named choices that the config schema and the runtime both take, each defined once.

The schema types its fields with these enums (a value outside them fails at compose time);
the runtime works on their string values, and derives its tuples of accepted values from
them (``fuelpipe.backbone.OFFSET_MODES``, ``fuelpipe.plan.backends.CACHE_POLICIES``).
Torch-free, so the schema can import it.
"""
from __future__ import annotations

import enum


class OffsetMode(enum.Enum):
    """How a decode step receives the write offset and live length (``plan.offset_mode``)."""

    tensor = "tensor"  # as device tensors: one program serves every position
    symbol = "symbol"  # as host integers, traced as symbols


class PlanMode(enum.Enum):
    """How a decode step's plan is held (``plan.mode``)."""

    replan = "replan"  # the step is built again every token (the reference for plan_once)
    plan_once = "plan_once"  # built once, only per-token data rebound
    captured = "captured"  # CUDA graph replay: in the schema, refused by the validator until it is built

    @classmethod
    def parse(cls, value: "PlanMode | str") -> "PlanMode":
        """``value`` as a mode the decode driver runs (replan or plan_once); a ``ConfigError`` otherwise."""
        from fuelpipe.errors import ConfigError, enum_member

        mode = enum_member(cls, value, "plan mode")
        if mode not in RUNNABLE_PLAN_MODES:
            raise ConfigError(f"plan mode must be one of {[m.value for m in RUNNABLE_PLAN_MODES]} on this build, "
                              f"got {mode.value!r} (CUDA graph capture is not built yet)")
        return mode


RUNNABLE_PLAN_MODES = (PlanMode.replan, PlanMode.plan_once)


class QuantKind(enum.Enum):
    """How a model's matrices are held (``weights.dtype``)."""

    f32 = "f32"
    bf16 = "bf16"  # weight-only: bf16 matrices, f32 activations
    int8 = "int8"  # weight-only, symmetric per group (GGUF Q8_0's form at group 32)
    int4 = "int4"  # weight-only, scale and min per group (GGUF Q4_1's form at group 32); vocabulary matrices int8


class ActivationForm(enum.Enum):
    """How a low-bit linear takes its activations (``weights.activations``): as f32, or quantized per
    32-element block to 16 or 8 bits (integer dot products in the kernel; see ``fuelpipe.quant``)."""

    auto = "auto"  # int16 for int8 / int4 weights, f32 for the others
    f32 = "f32"
    int16 = "int16"
    int8 = "int8"  # opt-in: half the integer work of int16 per block, steps 258x coarser (max|x| / 127)


class CachePolicy(enum.Enum):
    """What a rebuild may reuse (``plan.cache_policy``; inductor only)."""

    cold = "cold"  # no compile caches: every build compiles from scratch
    warm = "warm"  # on-disk / in-memory compile caches may serve a rebuild


def values(choices: type[enum.Enum]) -> tuple[str, ...]:
    """The accepted string values of ``choices``, in definition order."""
    return tuple(member.value for member in choices)
