"""Planted bugs in the gate's own blind spots (issue 34): RoPE scalings no tiny model uses, the quantizer's
rule, the stored plans' content key. Each is a pytest monkeypatch of a few lines, none a ``Fault``; the
planted-bugs study runs each through ``experiment=parity`` and the oracle tests use them directly.
"""
from __future__ import annotations

import dataclasses

import torch


def yarn_attention_factor_dropped(mp):
    """YaRN's cos/sin attention factor is never applied (no tiny gate model uses YaRN)."""
    from fuelpipe.rope import RopeScaling

    mp.setattr(RopeScaling, "cos_sin_factor", lambda self: 1.0)


def quantizer_sixteen_intervals(mp):
    """The 4-bit quantizer spreads [min, max] over 16 intervals where its 15 codes need 15: the top clips."""
    import fuelpipe.quant.formats as formats
    import fuelpipe.quant.modules as modules

    original = formats.quantize

    def quantize(w, kind, group_size):
        if kind is not formats.QuantKind.int4:
            return original(w, kind, group_size)
        n, k = w.shape
        groups = w.detach().float().view(n, k // group_size, group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)
        scale = ((hi - lo) / 16.0).to(torch.float16)
        codes = torch.round((groups - lo.half().float()[..., None]) / scale.float()[..., None]).clamp_(0, 15)
        return formats.PackedWeight(kind, formats.pack_int4(codes.view(n, k)), scale.contiguous(), lo.half().contiguous())
    mp.setattr(formats, "quantize", quantize)
    mp.setattr(modules, "quantize", quantize)


def plan_key_without_threads(mp):
    """The stored plan's content key leaves out the intra-op thread count the split pass divides by."""
    from fuelpipe.plan import plan_cache_key

    original = plan_cache_key.content_key
    mp.setattr(plan_cache_key, "content_key", lambda *a, **k: dataclasses.replace(original(*a, **k), threads=0))


def plan_key_without_pass_sources(mp):
    """The stored plan's content key hashes fuelpipe's own plan modules but not the source of each named pass."""
    from fuelpipe.plan import plan_cache_key

    original = plan_cache_key.recipe_source_digest
    mp.setattr(plan_cache_key, "recipe_source_digest", lambda fx_passes=(), **k: original((), **k))
