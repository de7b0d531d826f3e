"""The decode path against its Hugging Face transformers twin: an external reference, within a max-abs tolerance.

``vs_reference`` compares the decode path with the family's own no-cache
reference, so a bug both share (RoPE frequency or scaling math, which layers
slide, how a config field is read) is invisible to it. Here the twin is built
by transformers from the run's config (``hf_twin``: transformers derives the
layer kinds, windows and RoPE frequencies itself) with the same weights
(computing in float32, so a bfloat16 run is measured against exact math), and
one full forward over the generated sequence is compared with the decode
path's logits, greedy tokens forced as in ``vs_reference``. The model's config
reaches one RoPE scaling kind at most, so the RoPE tables of every other kind
(linear, llama3, each YaRN branch) are also compared with transformers' at the
model's base and rotary width (``rope_twin``): a scaling bug fails the gate on
any model, not only on a checkpoint that uses that scaling. The tolerance is
per model dtype (experiment.oracles.vs_transformers.tolerance), scaled by the
largest twin logit beyond magnitude 1, as in ``vs_reference``.

Without transformers (or for a family, or a config value, with no twin) the
result is *skipped*, with the reason: never a pass it did not check. The
negative control plants ROPE_FREQ_EXPONENT in ``fuelpipe.rope``, shared by
the decode path and every family's reference (``vs_reference`` still passes
under it).
"""
from __future__ import annotations

import torch

from fuelpipe.oracles import hf_twin, rope_twin
from fuelpipe.oracles.base import OracleInput, OracleResult, compare_scaled, greedy_run, skipped
from fuelpipe.oracles.planted import planted

NAME = "vs_transformers"


def layer_kinds(config) -> list[str]:
    """Each layer's attention kind as transformers sees it (a config without layer_types slides everywhere or nowhere)."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)
    uniform = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [uniform] * config.num_hidden_layers


def run(inp: OracleInput) -> OracleResult:
    family = inp.model.family
    reason = hf_twin.unavailable_reason(family)
    if reason is not None:
        return skipped(NAME, reason, inp.tolerance)
    try:
        hf_twin.hf_config(family, inp.model.config)
    except hf_twin.TwinError as err:  # a config value transformers cannot express: nothing to compare against
        return skipped(NAME, f"no faithful transformers twin of this {family} config: {err}", inp.tolerance)
    prompt = list(inp.prompts[0])
    with planted(inp.fault):
        ctx = inp.setup.context(inp.model, fault=inp.fault)
        tokens, got = greedy_run(ctx, inp.cache(ctx), prompt, inp.new_tokens)
        bases = sorted({(s.theta, s.rotary_dim) for s in inp.model.rope_plan.specs})
        scalings = [c for theta, dim in bases for c in rope_twin.compare_scalings(theta, dim)]
    twin = hf_twin.twin_of(inp.model)
    ids = torch.tensor([prompt + tokens[:-1]], dtype=torch.int64, device=ctx.device)
    with torch.no_grad():
        want = list(twin(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 :].float())
    worst, first, scale, allowed = compare_scaled(want, got, inp.tolerance)
    kinds = sorted(set(layer_kinds(twin.config)))
    wrong = [c.seen() for c in scalings if not c.ok]
    detail = (f"max |logits - transformers {type(twin).__name__}| over {len(got)} tokens ({len(ids[0])} positions, "
              f"layer kinds {', '.join(kinds)}), {ctx.plan.mode.value} on {ctx.plan.spec.name}, allowed "
              f"{inp.tolerance:g} x logit scale {scale:.3g} = {allowed:.3g}; RoPE tables of {len(scalings)} scalings "
              f"equal transformers' within {rope_twin.TABLE_ATOL:g}")
    if wrong:
        detail = "RoPE tables differ from transformers': " + "; ".join(wrong) + " | " + detail
    return OracleResult(
        name=NAME,
        passed=first is None and not wrong,
        metric={"max_abs_error": worst, "first_divergent_step": first, "steps": len(got), "logit_scale": scale,
                "rope_scalings": len(scalings), "rope_scalings_wrong": len(wrong),
                "rope_table_err": max((c.table_err for c in scalings), default=0.0)},
        tolerance=inp.tolerance,
        detail=detail,
    )
