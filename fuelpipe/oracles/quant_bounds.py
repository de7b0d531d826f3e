"""Each packed matrix against the f32 matrix it was made from, held to its format's own rounding bound.

How close a quantized model's logits stay to the f32 model's depends on the
checkpoint, so ``quant_quality``'s tolerances are loose, and a quantizer with a
wrong rule (16 intervals for 15, a scale rounded the wrong way, a clamp one code
short) can pass them. The rule itself has an exact bound, whatever the model:
round-to-nearest onto a grid of step ``s`` misses each element by at most ``s / 2``.

* int8 (symmetric): ``|w - q * s| <= s / 2``;
* int4 (asymmetric): ``|w - (code * s + min)| <= s / 2``;
* bf16: ``|w - bf16(w)| <= 2^-8 |w|`` (round to nearest, 8 significant bits: half a unit in the last place).

``s`` and ``min`` are stored in f16 (the GGUF convention), which moves the grid by
up to 2^-11 of a value: each group gets that slack, ``SLACK`` x its largest |w|.
A checkpoint's own blocks kept as they are (GGUF Q8_0 / Q4_1) meet the bound with
no error at all, because the f32 model is their dequantization; so the quantizer is
also run here on the first few dense matrices of the checkpoint at the run's kind and
group size, where it must meet the same bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fuelpipe.quant import formats
from fuelpipe.quant.formats import QuantKind, dequantize, fits

SLACK = 2.0**-8  # of a group's largest |w|: f16 scale and min rounding (2^-11 each, with room)
QUANTIZER_SAMPLES = 4  # dense matrices the quantizer is run on directly


@dataclass(frozen=True)
class BoundCheck:
    name: str
    kind: str
    ratio: float  # worst |error| / bound over the matrix: <= 1 holds

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0


def bound_ratio(kind: QuantKind, dense: torch.Tensor, packed) -> float:
    """max over elements of |dense - dequantize(packed)| / (the rule's bound) for one [N, K] matrix."""
    w = dense.detach().float()
    got = dequantize(packed)
    err = (got - w).abs()  # [N, K]
    if kind is QuantKind.bf16:
        bound = w.abs() * 2.0**-8 + torch.finfo(torch.float32).tiny
        return float((err / bound).max())
    g = packed.group_size
    n, k = w.shape
    step = packed.scales.float().repeat_interleave(g, dim=-1)  # [N, K]
    largest = w.view(n, k // g, g).abs().amax(-1).repeat_interleave(g, dim=-1)  # [N, K]
    bound = step / 2 + SLACK * largest + torch.finfo(torch.float32).tiny
    return float((err / bound).max())


def check_model(model: nn.Module, dense: nn.Module, spec) -> list[BoundCheck]:
    """Every packed matrix of ``model`` against ``dense``'s same-named one, then the quantizer itself on the first
    ``QUANTIZER_SAMPLES`` dense matrices at the spec's kind and group size."""
    from fuelpipe.quant.modules import _Packed

    out = []
    for name, module in model.named_modules():
        if isinstance(module, _Packed):
            p = module.packed()
            out.append(BoundCheck(name, p.kind.value, bound_ratio(p.kind, dense.get_submodule(name).weight, p)))
    sampled = 0
    for name, module in dense.named_modules():
        if sampled == QUANTIZER_SAMPLES:
            break
        if type(module) is nn.Linear and fits(spec, module.weight.shape[1]):
            p = formats.quantize(module.weight, spec.kind, spec.group_size)
            out.append(BoundCheck(f"quantize({name})", spec.kind.value, bound_ratio(spec.kind, module.weight, p)))
            sampled += 1
    return out
