"""Build the model and the context setup a validated config describes.

Only called after ``fuelpipe.config.validate`` returned no reasons, so the
names here are known to exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from omegaconf import DictConfig

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.config.validate import needed_positions, resolve_device
from fuelpipe.driver import PlanMode
from fuelpipe.kv.spec import KvSpec
from fuelpipe.oracles.base import Setup
from fuelpipe.plan.backends import BackendSpec
from models.registry import build_random_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Assembly:
    model: DecodeBackbone
    setup: Setup
    device: torch.device
    max_seq_len: int
    threads: int
    other_model: Callable[[], DecodeBackbone]  # same family, size, dtype, overrides; weights from seed + 1


def build_model(m: DictConfig, device: torch.device, seed: int) -> DecodeBackbone:
    return build_random_model(
        m.family, m.size, seed=seed, dtype=DTYPES[m.dtype.value], device=device, **m.overrides
    )


def setup_from(cfg: DictConfig) -> Setup:
    spec = BackendSpec(
        name=cfg.backend.name.value,
        fx_passes=tuple(cfg.backend.fx_passes),
        cache_policy=cfg.plan.cache_policy.value,
    )
    offset = cfg.plan.offset_mode.value if cfg.plan.offset_mode is not None else None
    kv = KvSpec(layout=cfg.kv.layout.value, block_size=cfg.kv.block_size or 16, num_blocks=cfg.kv.num_blocks)
    return Setup(spec, PlanMode.parse(cfg.plan.mode.value), offset, kv)


def assemble(cfg: DictConfig) -> Assembly:
    if cfg.backend.threads is not None:
        torch.set_num_threads(cfg.backend.threads)  # process-wide: one job per process
    torch.manual_seed(cfg.experiment.seed)
    device = resolve_device(cfg.backend.device)
    model = build_model(cfg.model, device, seed=cfg.model.seed)
    max_seq_len = cfg.kv.max_seq_len or needed_positions(cfg.experiment)
    other = partial(build_model, cfg.model, device, seed=cfg.model.seed + 1)
    return Assembly(model, setup_from(cfg), device, max_seq_len, torch.get_num_threads(), other)
