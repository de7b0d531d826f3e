"""Build a family model from an HF directory: ``config.json`` + ``*.safetensors`` (sharded or not).

The families' parameter names follow the HF checkpoints (``model.`` prefix
aside), so no name table is needed; a checkpoint that stores one parameter as
several tensors says how they combine (``Architecture.hf_state_transform``).
Every tensor is checked (name, shape) before any is read; each is then read
once, refused if not finite, and converted to the configured dtype.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch

from fuelpipe.weights.architectures import Architecture, by_hf_architecture
from fuelpipe.weights.assign import assign, put
from fuelpipe.weights.config_readers import HfConfigReader
from fuelpipe.weights.errors import (
    CheckpointConfigError, CheckpointFormatError, MissingTensorError, PickleRefusedError, UnknownArchitectureError,
    UnsupportedFormatError,
)
from fuelpipe.weights.finite import check_finite
from fuelpipe.weights.meta_build import build_config, family_of, meta_model, read_config
from fuelpipe.weights.sniff import PICKLE_SUFFIXES
from fuelpipe.weights.tensor_plan import check_shape, plan_tensors
from models.registry import did_you_mean

# Buffers older transformers wrote into checkpoints that are derived from the config, not weights.
HF_DERIVED = ("rotary_emb.inv_freq",)


def hf_weight_files(path: Path) -> list[Path]:
    """The directory's safetensors files (the index's shards when there is one); a pickle-only directory is refused."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise CheckpointFormatError(index, f"unreadable safetensors index: {e}") from None
        files = [path / s for s in shards]
        absent = [str(p.name) for p in files if not p.is_file()]
        if absent:
            raise CheckpointFormatError(index, f"names shards that are not in the directory: {absent}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise PickleRefusedError(pickles[0], "pickle checkpoints are refused (loading one can run arbitrary code); "
                                             "convert it to safetensors or GGUF")
    raise UnsupportedFormatError(path, "the directory has no *.safetensors weights")


def hf_param_name(name: str) -> str:
    """HF checkpoint name -> family parameter name: the families follow HF names minus the ``model.`` prefix."""
    return name[len("model."):] if name.startswith("model.") else name


def _combined(path: Path, arch: Architecture, config, owner: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """Whole-tensor name -> ``Combined`` for the parameters this checkpoint stores in parts (none for most)."""
    if arch.hf_state_transform is None:
        return {}
    out, part_of = {}, {}
    for c in arch.hf_state_transform(path, config, shapes):
        if c.name in owner or c.name in out:
            raise CheckpointFormatError(path, f"tensor {c.name!r} is stored both whole and in parts")
        for src in c.sources:
            if src not in owner:
                raise MissingTensorError(path, f"missing tensor {src!r} (a part of {c.name!r})")
            if src in part_of:
                raise CheckpointFormatError(path, f"tensor {src!r} is a part of both {part_of[src]!r} and {c.name!r}")
            part_of[src] = c.name
        out[c.name] = c
    return out


def _read_config_json(path: Path) -> tuple[Path, dict]:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UnsupportedFormatError(path, "an HF checkpoint directory needs a config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise CheckpointFormatError(cfg_path, f"config.json is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(cfg_path, f"config.json must hold a JSON object, got {type(cfg).__name__}")
    return cfg_path, cfg


def _architecture(cfg_path: Path, cfg: dict) -> tuple[str, Architecture]:
    """The one architecture ``config.json`` names, among the registered families' architectures."""
    names = cfg.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointConfigError(cfg_path, f"config.json architectures must be a list of names, got {names!r}")
    archs = by_hf_architecture()
    if len(names) != 1 or names[0] not in archs:
        shown = names[0] if len(names) == 1 else names
        raise UnknownArchitectureError(
            cfg_path, did_you_mean("architecture", str(shown), archs) if len(names) == 1
            else f"config.json must name exactly one architecture, got {shown}; available: {', '.join(sorted(archs))}"
        )
    return names[0], archs[names[0]]


def load_hf_dir(path: Path, dtype: torch.dtype, report_times: dict[str, float]):
    from safetensors import SafetensorError, safe_open

    t0 = time.perf_counter()
    cfg_path, cfg = _read_config_json(path)
    files = hf_weight_files(path)  # refuses a pickle-only directory before anything else is read
    arch_name, arch = _architecture(cfg_path, cfg)
    entry = family_of(cfg_path, arch, arch_name)
    fields = read_config(cfg_path, lambda: arch.config_from_hf(HfConfigReader(cfg_path, cfg)), "config.json")
    config = build_config(cfg_path, entry, fields)
    report_times["header"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = meta_model(entry, config, dtype)
    params = dict(model.named_parameters(remove_duplicate=False))
    handles, owner = [], {}
    try:
        for file in files:
            h = safe_open(str(file), framework="pt")
            handles.append(h)
            for name in h.keys():
                if name.endswith(HF_DERIVED):
                    continue
                if name in owner:
                    raise CheckpointFormatError(file, f"tensor {name!r} also appears in {owner[name][0].name}")
                owner[name] = (file, h)
    except SafetensorError as e:
        raise CheckpointFormatError(file, f"not a readable safetensors file: {e}") from None
    head_owned = "lm_head.weight" in params
    shapes = {name: tuple(h.get_slice(name).get_shape()) for name, (_, h) in owner.items()}
    combined = _combined(path, arch, config, owner, shapes)
    parts = {s for c in combined.values() for s in c.sources}

    def resolve(name: str) -> tuple[str, None]:
        target = hf_param_name(name)
        if target == "lm_head.weight" and not head_owned:
            target = "embed_tokens.weight"  # the family folds its (always tied) head into the embedding
        return target, None

    sources = [name for name in owner if name not in parts] + list(combined)
    plan = plan_tensors(path, model, sources, resolve, lambda t: f"model.{t}" if t != "lm_head.weight" else t,
                        f"{arch.family} model")
    for p in plan:
        if p.source in combined:
            check_shape(path, p.source, combined[p.source].shape, params[p.target].shape, p.target)
        else:
            check_shape(owner[p.source][0], p.source, shapes[p.source], params[p.target].shape, p.target)
    report_times["build"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    first: dict[str, str] = {}
    types: Counter = Counter()
    checked = 0.0

    def read(name: str) -> torch.Tensor:
        """One stored tensor, as stored, refused if not finite."""
        nonlocal checked
        file, h = owner[name]
        try:
            w = h.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointFormatError(file, f"tensor {name!r} cannot be read: {e}") from None
        types[str(w.dtype).removeprefix("torch.")] += 1
        t1 = time.perf_counter()
        check_finite(file, name, w)
        checked += time.perf_counter() - t1
        return w

    for p in plan:
        if p.source in combined:
            c = combined[p.source]
            file, w = path, c.combine([read(s) for s in c.sources])
        else:
            file, w = owner[p.source][0], read(p.source)
        put(file, tensors, first, p, w.to(dtype))
    assign(path, model, tensors)
    report_times["weights"] = time.perf_counter() - t0 - checked
    report_times["finite_check"] = checked
    return model, config, arch_name, dict(types)
