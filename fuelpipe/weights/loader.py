"""Build a family model from a GGUF file or an HF safetensors directory.

Both paths end the same way: the family's model is built on the meta device
(no storage), every checkpoint tensor is checked against the parameter it
maps onto (name, shape, quantisation type) before any data is read, then each
tensor is materialised once, converted to the configured dtype, and handed to
``load_state_dict(assign=True)``. Peak memory is therefore the final weights
plus one tensor in flight (and the file's pages, which the kernel can drop).
"""
from __future__ import annotations

import json
import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from fuelpipe.errors import ConfigError
from fuelpipe.weights import dequant
from fuelpipe.weights.architectures import (
    Architecture, GgufConfigReader, HfConfigReader, TensorRule, by_gguf_arch, by_hf_architecture,
)
from fuelpipe.weights.finite import check_finite
from fuelpipe.weights.errors import (
    CheckpointConfigError, CheckpointFormatError, MissingTensorError, PickleRefusedError, TensorShapeError,
    UnexpectedTensorError, UnknownArchitectureError, UnsupportedFormatError, UnsupportedQuantError, WeightsError,
)
from fuelpipe.weights.gguf_file import GgufFile
from fuelpipe.weights.named import named_path
from fuelpipe.weights.tokenizer import TextTokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir
from models.registry import did_you_mean, family

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save zip archive, raw pickle protocol 2+


@dataclass
class LoadReport:
    """What was loaded and what it cost. ``peak_rss_mb`` is the process's resident peak during the load."""

    source: Path
    format: str  # "gguf" | "safetensors"
    architecture: str
    family: str
    config: Any
    dtype: torch.dtype
    n_params: int = 0
    form: str = ""  # how the weights are held (fuelpipe.quant.modules.stored_form); "": as ``dtype``
    weights_mb: float = 0.0  # final parameter bytes at ``dtype``
    tensor_types: dict[str, int] = field(default_factory=dict)  # stored type -> tensor count
    timings_s: dict[str, float] = field(default_factory=dict)  # header / build / weights / tokenizer
    load_s: float = 0.0
    rss_before_mb: float = 0.0
    peak_rss_mb: float = 0.0
    peak_is_process_lifetime: bool = False  # True when the peak could not be reset before the load

    def summary(self) -> str:
        types = ", ".join(f"{k} x{v}" for k, v in sorted(self.tensor_types.items()))
        return (
            f"{self.source.name}: {self.family} ({self.architecture}, {self.format}) {self.n_params / 1e6:.1f}M params "
            f"as {self.form or str(self.dtype).removeprefix('torch.')} ({self.weights_mb:.0f} MB) in {self.load_s:.2f}s "
            f"[{', '.join(f'{k} {v:.2f}s' for k, v in self.timings_s.items())}]; peak RSS {self.peak_rss_mb:.0f} MB "
            f"(from {self.rss_before_mb:.0f} MB); tensors: {types}"
        )


class LoadedModel(NamedTuple):
    model: torch.nn.Module
    tokenizer: Optional[TextTokenizer]  # None when not requested, or an HF directory without tokenizer.json
    report: LoadReport


# ---- memory accounting -------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) so the next reading covers this load only."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- shared: meta build, checks, assign ---------------------------------------------------
def _family_parts(path: Path, arch: Architecture, arch_name: str):
    try:
        entry = family(arch.family)
    except ConfigError as e:
        raise UnknownArchitectureError(path, f"architecture {arch_name!r} needs the model family "
                                             f"{arch.family!r}, which is not registered ({e})") from None
    if entry.config_cls is None:
        raise UnknownArchitectureError(path, f"family {arch.family!r} does not declare its config class")
    return entry


def _read_config(path: Path, read: Callable[[], dict], what: str) -> dict:
    """The family config fields a checkpoint's own config describes; a malformed value is a typed refusal."""
    try:
        return read()
    except WeightsError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # a value of the wrong shape or type
        raise CheckpointConfigError(path, f"{what} holds an invalid value ({type(e).__name__}: {e})") from None


def _build_config(path: Path, entry, kwargs: dict):
    try:
        return entry.config_cls(**kwargs)
    except (ConfigError, TypeError) as e:
        raise CheckpointConfigError(path, f"the checkpoint's config does not make a valid {entry.name} config: {e}") from None


class _SkipMetaInit(TorchFunctionMode):
    """Random init of a meta tensor writes nothing, so skip it.

    Scoped to the meta build. Worth it: ``normal_`` on meta (``nn.Embedding``'s init) runs the
    Python reference kernel, whose first call imports sympy and ~800 modules, 2.3 s of a 4.5 s load.
    """

    _INIT = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_,
             nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.kaiming_uniform_,
             nn.init.kaiming_normal_, nn.init.xavier_uniform_, nn.init.xavier_normal_, nn.init.zeros_,
             nn.init.ones_, nn.init.constant_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._INIT:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def _meta_model(entry, config, dtype: torch.dtype) -> torch.nn.Module:
    with _SkipMetaInit():
        return entry.model_cls(config, device="meta", dtype=dtype)  # parameters without storage


def _param_groups(model: torch.nn.Module, only_meta: bool = False) -> dict[str, list[str]]:
    """Canonical name -> every state-dict name sharing that tensor (a tied head shares the embedding).

    ``only_meta``: only tensors still without data (the rest of a model whose matrices were packed)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if not only_meta or p.is_meta:
            groups.setdefault(id(p), []).append(name)
    for name, b in model.named_buffers(remove_duplicate=False):
        if b is not None and (not only_meta or b.is_meta):
            groups.setdefault(id(b), []).append(name)
    return {names[0]: names for names in groups.values()}


@dataclass(frozen=True)
class _Planned:
    source: str  # checkpoint tensor name
    target: str  # canonical parameter name
    transform: Optional[Callable]


def _plan(
    path: Path, model: torch.nn.Module, sources: Iterable[str], resolve: Callable[[str], Optional[tuple[str, Any]]],
    expected_source: Callable[[str], str], what: str,
) -> list[_Planned]:
    """Match checkpoint tensors to parameters; refuse unknown tensors and missing parameters by name."""
    groups = _param_groups(model)
    canonical = {name: canon for canon, names in groups.items() for name in names}
    planned: dict[str, list[_Planned]] = {}
    for src in sources:
        hit = resolve(src)
        if hit is None or hit[0] not in canonical:
            raise UnexpectedTensorError(path, f"tensor {src!r} has no counterpart in the {what} built from this "
                                              "checkpoint's config")
        target, transform = hit
        planned.setdefault(canonical[target], []).append(_Planned(src, canonical[target], transform))
    missing = [c for c in groups if c not in planned]
    if missing:
        names = ", ".join(f"{expected_source(m)!r} (for {m})" for m in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise MissingTensorError(path, f"missing tensor {names}{more}")
    return [p for group in planned.values() for p in group]


def _check_shape(path: Path, src: str, got: tuple[int, ...], want: tuple[int, ...], target: str) -> None:
    if tuple(got) != tuple(want):
        raise TensorShapeError(path, f"tensor {src!r} has shape {list(got)}, but {target} needs {list(want)}")


# Where a weight's data starts, in bytes: a cache line. Arrays that arrive from numpy (a GGUF tensor
# dequantized, a safetensors read) are only 16-byte aligned, so the vector loads of every GEMV row split
# cache lines; measured on SmolLM2-135M f32, AMD EPYC (AVX-512), 1 thread, one process, plans side by
# side: the same AOT plan on the loaded weights 1.3 ms/token slower than on 64-byte aligned copies.
WEIGHT_ALIGN = 64


def aligned(w: torch.Tensor) -> torch.Tensor:
    """``w`` itself when contiguous and cache-line aligned, else a contiguous copy in torch's own
    allocation (its CPU allocator aligns to 64 bytes). The caller keeps only the returned tensor."""
    if w.is_contiguous() and w.data_ptr() % WEIGHT_ALIGN == 0:
        return w
    return torch.empty(w.shape, dtype=w.dtype, device=w.device).copy_(w)


def _put(path: Path, tensors: dict[str, torch.Tensor], first: dict[str, str], p: "_Planned", w: torch.Tensor) -> None:
    """Keep ``w`` for its parameter (cache-line aligned); a second source for one tied parameter must
    hold the same values."""
    if p.target not in tensors:
        tensors[p.target], first[p.target] = aligned(w), p.source
    elif not torch.equal(tensors[p.target], w):
        raise CheckpointConfigError(path, f"tensors {first[p.target]!r} and {p.source!r} both load the tied "
                                          f"parameter {p.target} but differ (is the head really tied?)")


def _assign(path: Path, model: torch.nn.Module, tensors: dict[str, torch.Tensor], only_meta: bool = False) -> None:
    """``load_state_dict(assign=True)`` for every name, then re-tie tensors the model shared.

    ``only_meta``: the packed matrices already hold their data; load the rest (norms, biases)."""
    groups = _param_groups(model, only_meta)
    state = {name: tensors[canon] for canon, names in groups.items() for name in names}
    model.load_state_dict(state, strict=not only_meta, assign=True)
    for canon, names in groups.items():
        owner_name, _, leaf = canon.rpartition(".")
        shared = getattr(model.get_submodule(owner_name), leaf)
        for alias in names[1:]:
            mod_name, _, alias_leaf = alias.rpartition(".")
            setattr(model.get_submodule(mod_name), alias_leaf, shared)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise WeightsError(path, f"tensors left without data after loading: {left[:6]}")


# ---- GGUF ----------------------------------------------------------------------------------
def _expand(rules: tuple[TensorRule, ...], n_layers: int) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for r in rules:
        if "{i}" in r.source:
            for i in range(n_layers):
                out[r.source.format(i=i)] = (r.target.format(i=i), r.transform)
        else:
            out[r.source] = (r.target, r.transform)
    return out


def _matrix_targets(model: torch.nn.Module, quant) -> dict[str, bool]:
    """Weight name -> is a vocabulary matrix, for every matrix ``quant`` will pack."""
    from torch import nn

    from fuelpipe.quant.formats import fits
    from fuelpipe.quant.modules import vocabulary_matrix

    out = {}
    for name, module in model.named_modules():
        if type(module) in (nn.Linear, nn.Embedding) and fits(quant, module.weight.shape[1]):
            out[f"{name}.weight"] = vocabulary_matrix(name, module)
    return out


def _packed_from_file(path: Path, f, info, p: "_Planned", config, quant, vocabulary: bool):
    """One matrix of the file in the packed form ``quant`` asks for: its own blocks when usable, else quantized."""
    from fuelpipe.quant import gguf_blocks
    from fuelpipe.quant.formats import quantize

    kind = gguf_blocks.kind_for(quant, vocabulary, info.ggml_type)
    packed = gguf_blocks.packed_from_blocks(f.raw(info), info.ggml_type, info.shape, kind, quant.group_size)
    if packed is not None:
        if p.transform is None:
            return packed, True
        perm = gguf_blocks.row_permutation(p.transform, info.shape[0], config)
        if perm is not None:
            return gguf_blocks.permute_rows(packed, perm), True
    w = torch.from_numpy(dequant.dequantize(f.raw(info), info.ggml_type, info.shape))
    check_finite(path, p.source, w)
    if p.transform is not None:
        w = p.transform(w, config)
    return quantize(w, kind, quant.group_size), False


def load_gguf(path: Path, dtype: torch.dtype, report_times: dict[str, float], quant=None):
    t0 = time.perf_counter()
    f = GgufFile(path)
    arch_name = f.architecture
    archs = by_gguf_arch()
    if arch_name not in archs:
        raise UnknownArchitectureError(path, did_you_mean("GGUF architecture", arch_name, archs))
    arch = archs[arch_name]
    entry = _family_parts(path, arch, arch_name)
    shapes = {name: info.shape for name, info in f.tensors.items()}
    reader = GgufConfigReader(path, arch_name, f.metadata, shapes)
    fields = _read_config(path, lambda: arch.config_from_gguf(reader), "the GGUF metadata")
    config = _build_config(path, entry, fields)
    report_times["header"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = _meta_model(entry, config, dtype)
    n_layers = model.dims.n_layers
    table = _expand(arch.gguf_tensors, n_layers)
    reverse = {target: src for src, (target, _) in table.items()}
    plan = _plan(path, model, f.tensors, table.get, lambda t: reverse.get(t, "?"), f"{arch.family} model")
    params = dict(model.named_parameters(remove_duplicate=False))
    for p in plan:
        info = f.tensors[p.source]
        if not dequant.is_supported(info.ggml_type):
            raise UnsupportedQuantError(
                path, f"tensor {p.source!r} is stored as {info.type_name}, which this loader cannot dequantize; "
                f"supported: {', '.join(t.name for t in dequant.SUPPORTED_TYPES)}"
            )
        _check_shape(path, p.source, info.shape, params[p.target].shape, p.target)
    report_times["build"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    first: dict[str, str] = {}
    checked = 0.0
    matrices = _matrix_targets(model, quant) if quant is not None and quant.quantized else {}
    packed: dict = {}
    as_is = 0
    for p in plan:
        info = f.tensors[p.source]
        if p.target in matrices:
            # Packed straight from the file, one tensor at a time: the f32 model never exists.
            if p.target not in packed:
                packed[p.target], kept = _packed_from_file(path, f, info, p, config, quant, matrices[p.target])
                as_is += kept
            continue
        w = torch.from_numpy(dequant.dequantize(f.raw(info), info.ggml_type, info.shape))
        t1 = time.perf_counter()
        check_finite(path, p.source, w)  # as stored (dequantized), before any transform moves the values
        checked += time.perf_counter() - t1
        if p.transform is not None:
            w = p.transform(w, config)
        _put(path, tensors, first, p, w.to(dtype))
    if matrices:
        from fuelpipe.quant.modules import quantize_model

        quantize_model(model, quant, packed)
        model.packed_as_stored = as_is  # matrices whose file blocks were kept as they are
    _assign(path, model, tensors, only_meta=bool(matrices))
    report_times["weights"] = time.perf_counter() - t0 - checked
    report_times["finite_check"] = checked
    types = Counter(f.tensors[p.source].type_name for p in plan)
    return model, config, arch_name, dict(types), f


# ---- HF safetensors directory ------------------------------------------------------------
def _hf_weight_files(path: Path) -> list[Path]:
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


# Buffers older transformers wrote into checkpoints that are derived from the config, not weights.
_HF_DERIVED = ("rotary_emb.inv_freq",)


def _hf_param_name(name: str) -> str:
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


def load_hf_dir(path: Path, dtype: torch.dtype, report_times: dict[str, float]):
    from safetensors import SafetensorError, safe_open

    t0 = time.perf_counter()
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UnsupportedFormatError(path, "an HF checkpoint directory needs a config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise CheckpointFormatError(cfg_path, f"config.json is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(cfg_path, f"config.json must hold a JSON object, got {type(cfg).__name__}")
    files = _hf_weight_files(path)  # refuses a pickle-only directory before anything else is read
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
    arch = archs[names[0]]
    entry = _family_parts(cfg_path, arch, names[0])
    fields = _read_config(cfg_path, lambda: arch.config_from_hf(HfConfigReader(cfg_path, cfg)), "config.json")
    config = _build_config(cfg_path, entry, fields)
    report_times["header"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = _meta_model(entry, config, dtype)
    params = dict(model.named_parameters(remove_duplicate=False))
    handles, owner = [], {}
    try:
        for file in files:
            h = safe_open(str(file), framework="pt")
            handles.append(h)
            for name in h.keys():
                if name.endswith(_HF_DERIVED):
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
        target = _hf_param_name(name)
        if target == "lm_head.weight" and not head_owned:
            target = "embed_tokens.weight"  # the family folds its (always tied) head into the embedding
        return target, None

    sources = [name for name in owner if name not in parts] + list(combined)
    plan = _plan(path, model, sources, resolve, lambda t: f"model.{t}" if t != "lm_head.weight" else t,
                 f"{arch.family} model")
    for p in plan:
        if p.source in combined:
            _check_shape(path, p.source, combined[p.source].shape, params[p.target].shape, p.target)
        else:
            _check_shape(owner[p.source][0], p.source, shapes[p.source], params[p.target].shape, p.target)
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
        _put(file, tensors, first, p, w.to(dtype))
    _assign(path, model, tensors)
    report_times["weights"] = time.perf_counter() - t0 - checked
    report_times["finite_check"] = checked
    return model, config, names[0], dict(types)


# ---- dispatch ----------------------------------------------------------------------------
def sniff_format(path: Path) -> str:
    """"gguf" | "hf_dir"; refuses pickles and anything else with a typed error naming the path."""
    if not path.exists():
        raise UnsupportedFormatError(path, "no such file or directory")
    if path.is_dir():
        return "hf_dir"
    if path.suffix in PICKLE_SUFFIXES:
        raise PickleRefusedError(path, f"{path.suffix} checkpoints are pickles and are refused (loading one can "
                                       "run arbitrary code); convert it to safetensors or GGUF")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == b"GGUF":
        return "gguf"
    if any(head.startswith(m) for m in _PICKLE_MAGIC):
        raise PickleRefusedError(path, "the file is a pickle / torch.save archive and is refused (loading one can "
                                       "run arbitrary code); convert it to safetensors or GGUF")
    if path.suffix == ".safetensors":
        raise UnsupportedFormatError(path, "a lone .safetensors file has no config; pass its directory "
                                           "(config.json + *.safetensors)")
    raise UnsupportedFormatError(path, f"unrecognised checkpoint (first bytes {head!r}); "
                                       "expected a .gguf file or an HF safetensors directory")


# ---- entry points ------------------------------------------------------------------------
def load_model(
    source: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    with_tokenizer: bool = True, quant=None,
) -> LoadedModel:
    """Load a GGUF file or an HF safetensors directory into its registered family (see ``fuelpipe.weights``).

    ``quant`` (a ``fuelpipe.quant.QuantSpec``): hold the matrices in a low-bit form. From a GGUF file
    they are packed tensor by tensor, keeping the file's own blocks where the kernels take them."""
    from fuelpipe.quant.modules import logical_params, stored_form

    path = Path(source).expanduser()
    kind = sniff_format(path)
    rss_before = _rss_mb()
    exact_peak = _reset_peak_rss()
    t_start = time.perf_counter()
    times: dict[str, float] = {}
    tokenizer = None
    if kind == "gguf":
        model, config, arch, types, gguf_file = load_gguf(path, dtype, times, quant)
        if with_tokenizer:
            t0 = time.perf_counter()
            tokenizer = tokenizer_from_gguf(path, gguf_file.metadata)
            times["tokenizer"] = time.perf_counter() - t0
        del gguf_file  # unmaps the file: every tensor was copied out of it
        fmt = "gguf"
    else:
        model, config, arch, types = load_hf_dir(path, dtype, times)
        if quant is not None and quant.quantized:
            from fuelpipe.quant.modules import quantize_model

            quantize_model(model, quant)
        if with_tokenizer:
            t0 = time.perf_counter()
            tokenizer = tokenizer_from_hf_dir(path)
            times["tokenizer"] = time.perf_counter() - t0
        fmt = "safetensors"
    if torch.device(device) != torch.device("cpu"):
        t0 = time.perf_counter()
        model = model.to(device)
        times["to_device"] = time.perf_counter() - t0
    load_s = time.perf_counter() - t_start
    unique = {id(p): p for p in list(model.parameters()) + [b for b in model.buffers() if b is not None]}.values()
    report = LoadReport(
        source=path, format=fmt, architecture=arch, family=model.family, config=config, dtype=dtype,
        n_params=logical_params(model), form=stored_form(model),
        weights_mb=sum(p.numel() * p.element_size() for p in unique) / 2**20,
        tensor_types=types, timings_s=times, load_s=load_s, rss_before_mb=rss_before, peak_rss_mb=_peak_rss_mb(),
        peak_is_process_lifetime=not exact_peak,
    )
    return LoadedModel(model, tokenizer, report)


def load_named(name: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               with_tokenizer: bool = True, quant=None) -> LoadedModel:
    """Load a named shipped checkpoint (``smollm2_135m``, ``gemma3_270m``); see ``fuelpipe.weights.named``."""
    return load_model(named_path(name), dtype=dtype, device=device, with_tokenizer=with_tokenizer, quant=quant)
