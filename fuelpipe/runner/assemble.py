"""Build the model, its tokenizer and the context setup a validated config describes.

Only called after ``fuelpipe.config.validate`` returned no reasons, so the
names here are known to exist.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, Callable, Optional

import torch
from omegaconf import DictConfig

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.config.schema import Weights
from fuelpipe.config.validate import needed_positions, resolve_device
from fuelpipe.modes import PlanMode
from fuelpipe.errors import ConfigError
from fuelpipe.kv.spec import KvSpec
from fuelpipe.oracles.base import Setup
from fuelpipe.plan.aot_program import prewarm_compiler
from fuelpipe.plan.backends import BACKENDS, BackendSpec, plan_cache_dir
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.runner.model_record import model_record
from fuelpipe.runner.twin import Twin, twin_for
from models.registry import build_random_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Assembly:
    model: DecodeBackbone
    setup: Setup
    device: torch.device
    max_seq_len: int
    threads: int
    other_model: Callable[[], DecodeBackbone]  # same config; random: weights from seed + 1, checkpoint: a reload
    prompts: tuple[tuple[int, ...], ...]  # token ids every oracle and the benchmark use
    tokenizer: Optional[Any] = None  # a checkpoint's TextTokenizer; None for random weights
    load: dict = field(default_factory=dict)  # checkpoint load report (times, peak RSS), empty for random
    model_record: dict = field(default_factory=dict)  # what was loaded (results.json ``model``)
    # For quantized weights (weights.dtype): the same checkpoint with its matrices as built.
    dense_model: Optional[Callable[[], DecodeBackbone]] = None
    # The family's tiny twin for the oracles the weights cannot answer, built on first use; None: no twin.
    twin: Optional[Callable[[], Optional[Twin]]] = None


def quant_spec(w: Optional[DictConfig]):
    """The ``weights`` section as a ``QuantSpec``; None when the matrices stay as built."""
    from fuelpipe.quant.formats import QuantKind, QuantSpec

    if w is None or w.dtype is None:
        return None
    spec = QuantSpec(QuantKind(w.dtype.value), int(w.group_size), w.activations.value)
    return spec if spec.quantized else None


def load_checkpoint(m: DictConfig, device: torch.device, quant=None):
    """(model, tokenizer, report) of a checkpoint config."""
    from fuelpipe.weights import load_model, load_named

    dtype = DTYPES[m.dtype.value]
    if m.weights is Weights.shipped:
        return load_named(m.size, dtype=dtype, device=device, quant=quant)
    return load_model(m.path, dtype=dtype, device=device, quant=quant)


def build_model(m: DictConfig, device: torch.device, seed: int, quant=None) -> DecodeBackbone:
    if m.weights is not Weights.random:
        return load_checkpoint(m, device, quant)[0]
    model = build_random_model(
        m.family, m.size, seed=seed, dtype=DTYPES[m.dtype.value], device=device, **m.overrides
    )
    if quant is not None:
        from fuelpipe.quant.modules import quantize_model

        quantize_model(model, quant)
    return model


def setup_from(cfg: DictConfig) -> Setup:
    spec = BackendSpec(
        name=cfg.backend.name,
        fx_passes=tuple(cfg.backend.fx_passes),
        cache_policy=cfg.plan.cache_policy.value,
        plan_cache=PlanCacheSpec(dir=plan_cache_dir(cfg.backend.plan_cache.dir, cfg.backend.name),
                                 max_gb=float(cfg.backend.plan_cache.max_gb)),
        compile_prompt=bool(cfg.backend.compile_prompt),
    )
    offset = cfg.plan.offset_mode.value if cfg.plan.offset_mode is not None else None
    kv = KvSpec(layout=cfg.kv.layout, block_size=cfg.kv.block_size or 16, num_blocks=cfg.kv.num_blocks)
    return Setup(spec, PlanMode.parse(cfg.plan.mode.value), offset, kv)


def resolve_prompts(exp: DictConfig, tokenizer, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    if tokenizer is not None and exp.text_prompts:
        prompts = tuple(tuple(tokenizer.encode(text)) for text in exp.text_prompts)
    else:
        prompts = tuple(tuple(p) for p in exp.prompts)
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        source = "experiment.text_prompts" if tokenizer is not None and exp.text_prompts else "experiment.prompts"
        raise ConfigError(f"{source} entries {empty} are empty (or encode to no tokens); every prompt needs a token")
    bad = sorted({t for p in prompts for t in p if not 0 <= t < vocab_size})
    if bad:
        raise ConfigError(f"experiment prompts hold token ids {bad} outside the model's vocabulary [0, {vocab_size})")
    return prompts


def assemble(cfg: DictConfig) -> Assembly:
    if cfg.backend.threads is not None:
        torch.set_num_threads(cfg.backend.threads)  # process-wide: one job per process
    torch.manual_seed(cfg.experiment.seed)
    device = resolve_device(cfg.backend.device)
    m = cfg.model
    tokenizer, load, report = None, {}, None
    quant = quant_spec(cfg.get("weights"))
    if cfg.backend.name in BACKENDS and BACKENDS.get(cfg.backend.name).ahead_of_time:
        prewarm_compiler()  # inductor's import overlaps reading the weights
    if m.weights is Weights.random:
        model = build_model(m, device, seed=m.seed, quant=quant)
    else:
        model, tokenizer, report = load_checkpoint(m, device, quant)
        load = {"load_s": report.load_s, "summary": report.summary()}
    record = model_record(m, model, report)
    prompts = resolve_prompts(cfg.experiment, tokenizer, model.dims.vocab_size)
    need = needed_positions(cfg.experiment, prompts)
    max_seq_len = cfg.kv.max_seq_len or need
    if max_seq_len < need:
        raise ConfigError(f"kv.max_seq_len={max_seq_len} is smaller than the {need} positions the experiment writes")
    if max_seq_len > model.dims.max_position_embeddings:
        raise ConfigError(
            f"kv.max_seq_len={max_seq_len} exceeds the model's max_position_embeddings="
            f"{model.dims.max_position_embeddings}"
        )
    other = partial(build_model, m, device, seed=m.seed + 1, quant=quant)
    dense = None if quant is None else partial(build_model, m, device, seed=m.seed, quant=None)
    twin = None
    if cfg.experiment.mechanism_on_twin and m.weights is not Weights.random:  # a random model is its own twin
        twin = cache(partial(twin_for, record["family"], DTYPES[m.dtype.value], device, quant, prompts, max_seq_len))
    return Assembly(model, setup_from(cfg), device, max_seq_len, torch.get_num_threads(), other, prompts,
                    tokenizer, load, record, dense, twin)
