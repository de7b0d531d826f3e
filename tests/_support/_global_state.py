"""What a test may not leave changed behind it: process-wide settings that later tests read.

A leaked setting makes the suite order-dependent, and a warm cache can hide it: a deleted
inductor option is only read when inductor compiles C++ from cold. ``snapshot()`` records
every such setting; ``leaks(before)`` names what differs afterwards and ``restore(before)``
puts it back, so one leaking test fails alone instead of breaking an unrelated later one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.config as dynamo_config
import torch._inductor.config as inductor_config

from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan.backends import BACKENDS
from fuelpipe.plan.fx_passes import FX_PASSES
from fuelpipe.stages import STAGES
from models.registry import FAMILIES

# Variables the tools set for themselves: pytest around every phase, inductor on its first compile.
TOOLS_OWN = ("PYTEST_CURRENT_TEST", "_TORCHINDUCTOR_")


def _tools_own(key: str) -> bool:
    return key.startswith(TOOLS_OWN)


# Config entries torch fills in place itself: AOTInductor writes the target's platform and ISA into
# ``aot_inductor.metadata`` on every compile (the same values each time), whoever asked for it.
TORCH_FILLS = ("aot_inductor.metadata",)
REGISTRIES = {"oracles": ORACLES, "backends": BACKENDS, "fx passes": FX_PASSES, "stages": STAGES, "families": FAMILIES}


@dataclass(frozen=True)
class GlobalState:
    threads: int
    default_dtype: torch.dtype
    grad_enabled: bool
    deterministic: bool
    environ: dict[str, str]
    inductor: dict[str, Any]
    dynamo: dict[str, Any]
    registries: dict[str, dict[str, Any]]


def _registry_entries() -> dict[str, dict[str, Any]]:
    return {name: dict(reg._all()) for name, reg in REGISTRIES.items()}  # the live tables (loaded on first use)


def snapshot() -> GlobalState:
    return GlobalState(
        threads=torch.get_num_threads(),
        default_dtype=torch.get_default_dtype(),
        grad_enabled=torch.is_grad_enabled(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        environ={k: v for k, v in os.environ.items() if not _tools_own(k)},
        inductor={k: v for k, v in inductor_config.get_config_copy().items() if k not in TORCH_FILLS},
        dynamo=dynamo_config.get_config_copy(),
        registries=_registry_entries(),
    )


def _dict_changes(label: str, before: dict, after: dict) -> list[str]:
    out = []
    for key in sorted(set(before) | set(after), key=str):
        if key not in after:
            out.append(f"{label} {key} deleted (was {before[key]!r})")
        elif key not in before:
            out.append(f"{label} {key} added ({after[key]!r})")
        elif not _same(before[key], after[key]):
            out.append(f"{label} {key}: {before[key]!r} -> {after[key]!r}")
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values without a plain equality (tensors, callables): identity
        return a is b


def leaks(before: GlobalState) -> list[str]:
    now = snapshot()
    out = []
    for field in ("threads", "default_dtype", "grad_enabled", "deterministic"):
        if getattr(now, field) != getattr(before, field):
            out.append(f"torch {field}: {getattr(before, field)!r} -> {getattr(now, field)!r}")
    out += _dict_changes("os.environ", before.environ, now.environ)
    out += _dict_changes("torch._inductor.config", before.inductor, now.inductor)
    out += _dict_changes("torch._dynamo.config", before.dynamo, now.dynamo)
    for name in REGISTRIES:
        out += _dict_changes(f"{name} registry", before.registries[name], now.registries[name])
    return out


def restore(before: GlobalState) -> None:
    torch.set_num_threads(before.threads)
    torch.set_default_dtype(before.default_dtype)
    torch.set_grad_enabled(before.grad_enabled)
    torch.use_deterministic_algorithms(before.deterministic)
    for key in [k for k in os.environ if k not in before.environ and not _tools_own(k)]:
        del os.environ[key]
    os.environ.update(before.environ)
    inductor_config.load_config(before.inductor)
    dynamo_config.load_config(before.dynamo)
    for name, reg in REGISTRIES.items():
        table = reg._all()
        table.clear()
        table.update(before.registries[name])
