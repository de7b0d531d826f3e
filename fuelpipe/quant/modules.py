"""Modules holding low-bit weights, and turning a model's matrices into them.

``QuantLinear`` replaces an ``nn.Linear`` and ``QuantEmbedding`` an
``nn.Embedding``; their forward calls the compiled kernels
(``fuelpipe.kernels``), which fx and inductor see as opaque operators. Each
keeps a ``weight`` property that dequantizes on access: the readable
references (``models/*/reference.py``) read it, so they compute the quantized
model's own function in plain math.

``quantize_model`` swaps a model's matrices in place and stamps the spec on
the model (``DecoderModel.weight_format``), which enters the plan key: a plan
built for one kind or group size never serves another.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn

from fuelpipe.errors import ConfigError
from fuelpipe.quant.formats import (
    ActivationForm, PackedWeight, QuantKind, QuantSpec, activation_bits, dequantize, dequantize_rows, fits, quantize,
)


def _ops():
    from fuelpipe.kernels.build import load

    load()
    return torch.ops.fuelpipe_kernels


# Activation bits (``activation_bits``; None: f32) -> the suffix of the low-bit operators that take them.
OP_SUFFIX = {None: "", 16: "_a16", 8: "_a8"}


class _Packed(nn.Module):
    """Buffers q / scales / mins of one packed matrix (shared by a tied embedding and head)."""

    def _hold(self, p: PackedWeight, activations: ActivationForm) -> None:
        if activation_bits(activations) and p.kind not in (QuantKind.int8, QuantKind.int4):
            raise ConfigError(f"weights.activations={activations.value} needs int8 or int4 weights, got {p.kind.value}")
        self.kind = p.kind
        self.activations = activations
        self.out_features, self.in_features = p.shape
        self.group_size = p.group_size
        self.register_buffer("q", p.q)
        self.register_buffer("scales", p.scales)
        self.register_buffer("mins", p.mins)

    def packed(self) -> PackedWeight:
        return PackedWeight(self.kind, self.q, self.scales, self.mins)

    @property
    def weight(self) -> torch.Tensor:
        """The f32 [N, K] matrix these buffers stand for (a fresh tensor on every access)."""
        return dequantize(self.packed())

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x [.., K] f32 @ weight.T (+ bias) -> [.., N], through the compiled kernel."""
        ops = _ops()
        tail = OP_SUFFIX[activation_bits(self.activations)]
        if self.kind is QuantKind.int8:
            return getattr(ops, f"q8_gemv{tail}").default(x, self.q, self.scales, bias)
        if self.kind is QuantKind.int4:
            return getattr(ops, f"q4_gemv{tail}").default(x, self.q, self.scales, self.mins, bias)
        return ops.bf16_gemv.default(x, self.q, bias)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind.value}{g}, "
                f"activations={self.activations.value}")


class QuantLinear(_Packed):
    def __init__(self, p: PackedWeight, bias: Optional[torch.Tensor] = None,
                 activations: ActivationForm = ActivationForm.f32) -> None:
        super().__init__()
        self._hold(p, activations)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class QuantEmbedding(_Packed):
    """Rows of a packed table, dequantized per looked-up token; ``as_head`` uses it as a tied output matrix."""

    def __init__(self, p: PackedWeight, activations: ActivationForm = ActivationForm.f32) -> None:
        super().__init__()
        self._hold(p, activations)
        self.num_embeddings, self.embedding_dim = p.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.kind, self.q[ids], None if self.scales is None else self.scales[ids],
                               None if self.mins is None else self.mins[ids], self.embedding_dim,
                               self.group_size)  # [.., hidden]

    def as_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, None)


def embedding_head(embedding: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A tied output head: x @ embedding.weight.T, for a plain or a quantized embedding."""
    if isinstance(embedding, QuantEmbedding):
        return embedding.as_head(x)
    return torch.nn.functional.linear(x, embedding.weight)


def vocabulary_matrix(name: str, module: nn.Module) -> bool:
    """Embedding tables and output heads: kept at 8 bits when the kind is int4 (as llama.cpp's recipes do)."""
    return isinstance(module, nn.Embedding) or name.split(".")[-1] in ("lm_head", "output")


def target_kind(spec: QuantSpec, vocabulary: bool) -> QuantKind:
    return QuantKind.int8 if spec.kind is QuantKind.int4 and vocabulary else spec.kind


def quantize_model(model: nn.Module, spec: QuantSpec, packed: Optional[Mapping[str, PackedWeight]] = None) -> dict:
    """Replace the model's ``nn.Linear`` / ``nn.Embedding`` matrices by packed ones, in place.

    ``packed`` maps a weight's name (``layers.0.mlp.up_proj.weight``) to a ready packed form (a
    checkpoint's own blocks); other matrices are quantized from their current values. Matrices
    sharing one tensor (a tied head) share one packed form. Matrices whose in_features is not a
    multiple of the group size stay as they are. Returns counts per kind, for the load report.
    """
    if not spec.quantized:
        return {}
    packed = dict(packed or {})
    done: dict[int, PackedWeight] = {}
    counts: dict[str, int] = {}
    for name, module in list(model.named_modules()):
        if type(module) not in (nn.Linear, nn.Embedding):
            continue
        w = module.weight
        key = f"{name}.weight"
        if id(w) in done:
            p = done[id(w)]
        elif key in packed:
            p = packed.pop(key)
        elif fits(spec, w.shape[1]):
            if w.is_meta:
                raise ValueError(f"quantize_model: {key} has no data and no packed form")
            p = quantize(w, target_kind(spec, vocabulary_matrix(name, module)), spec.group_size)
        else:
            counts["kept_f32"] = counts.get("kept_f32", 0) + 1
            continue
        done[id(w)] = p
        activations = spec.activations if p.kind in (QuantKind.int8, QuantKind.int4) else ActivationForm.f32
        if isinstance(module, nn.Embedding):
            new = QuantEmbedding(p, activations)
        else:
            bias = module.bias
            new = QuantLinear(p, None if bias is None else bias.detach(), activations)
        owner_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner_name) if owner_name else model, leaf, new)
        counts[p.kind.value] = counts.get(p.kind.value, 0) + 1
    if hasattr(model, "set_weight_format"):
        model.set_weight_format(spec)
    return counts


def logical_params(model: nn.Module) -> int:
    """Parameters as the matrices they stand for: a packed matrix counts out x in, once (a tied one once).

    ``model.parameters()`` alone misses every packed matrix (its codes and scales are buffers)."""
    packed = {id(m.q): m.out_features * m.in_features for m in model.modules() if isinstance(m, _Packed)}
    plain = {id(p): p.numel() for p in model.parameters()}
    return sum(packed.values()) + sum(plain.values())


def stored_form(model: nn.Module) -> str:
    """How the weights are held: ``float32``, or ``int8/g32/a16 matrices + float32`` when quantized.

    The kinds actually held are named (int4 keeps vocabulary matrices at int8: ``int4/g32/a16 + int8
    matrices``); the plain dtype is that of the remaining parameters (norms, biases)."""
    plain = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    fmt = getattr(model, "weight_format", None)
    kinds = sorted({m.kind.value for m in model.modules() if isinstance(m, _Packed)})
    if fmt is None or not kinds:
        return "/".join(plain)
    held = [fmt.label(), *(k for k in kinds if k != fmt.kind.value)]
    return f"{' + '.join(held)} matrices" + (f" + {'/'.join(plain)}" if plain else "")


def dense_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every packed matrix as its dequantized f32 ``weight`` (for an external twin)."""
    state = model.state_dict()
    for name, module in model.named_modules():
        if isinstance(module, _Packed):
            prefix = f"{name}." if name else ""
            for leaf in ("q", "scales", "mins"):
                state.pop(prefix + leaf, None)
            state[prefix + "weight"] = module.weight
    return state


def scale_packed_(module: _Packed, factor: float, *, via_data: bool = False) -> None:
    """Scale the matrix a packed module stands for, in place (``copy_``) or through ``.data =``."""
    floats = [n for n in ("q", "scales", "mins") if getattr(module, n) is not None and getattr(module, n).is_floating_point()]
    for n in floats:
        t = getattr(module, n)
        if via_data:
            t.data = (t.float() * factor).to(t.dtype)
        else:
            t.copy_((t.float() * factor).to(t.dtype))


def scaled_copy(module: "QuantLinear", factor: float) -> "QuantLinear":
    """A new module computing ``factor`` x the matrix of ``module`` (same kind and group size)."""
    p = module.packed()
    scale = (lambda t: None if t is None else (t.float() * factor).to(t.dtype))
    q = scale(p.q) if p.q.is_floating_point() else p.q.clone()
    new = PackedWeight(p.kind, q, scale(p.scales), scale(p.mins))
    return QuantLinear(new, None if module.bias is None else module.bias.detach().clone(), module.activations)
