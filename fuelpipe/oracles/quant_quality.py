"""quant_quality: a low-bit plan against the f32 model of the same checkpoint.

Exact parity does not apply to quantized weights, so this oracle measures
how far the quantized plan's function is from the f32 one, over the
experiment's prompts, and holds each measure to a stated tolerance per kind
(``TOLERANCES``):

* ``top1``: share of decisive positions where the argmax token agrees (a position is
  decisive when the f32 model's best token leads its second by more than
  ``DECISIVE_MARGIN`` of the logits' std: a near-tie flips on any rounding and
  says nothing about the quantization; ``top1_all`` counts every position);
* ``max_err`` / ``mean_err``: max and mean absolute logit error, relative to
  the f32 logits' standard deviation (so one number fits any model's scale);
* ``kl``: mean KL(f32 || quantized) of the next-token distributions;
* ``greedy_agree``: how many greedy tokens the quantized plan produces before
  it first differs from the f32 model's (reported, and held to a minimum
  share of the run).

Those tolerances depend on the checkpoint, so they are loose; the quantization
rule itself is held to its exact rounding bound, matrix by matrix
(``quant_bounds``: every packed matrix against the f32 one it stands for, and the
quantizer run on the checkpoint's first dense matrices), which a wrong rule fails
on any model.

Both arms see the same token stream (the f32 model's greedy continuation,
teacher-forced), so one early difference cannot cascade. The quantized side
runs through the configured plan; the f32 side is the eager reference of the
dense model. Skipped, with the reason, when the model is not quantized.

Negative control (``Fault.QUANT_WRONG_SCALE``): a copy of the model whose
every packed matrix dequantizes with twice its scale, the bug of a
dequantizer that reads the wrong scale. It must fail.
"""
from __future__ import annotations

import copy

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult, forced_logits, greedy_run, skipped
from fuelpipe.oracles.quant_bounds import check_model

NAME = "quant_quality"
DECISIVE_MARGIN = 0.1  # of the f32 logits' std

# kind -> (min top1, max relative max_err, max relative mean_err, max mean KL, min greedy share)
TOLERANCES = {
    "bf16": (0.98, 0.10, 0.01, 0.005, 0.5),
    "int8": (0.90, 0.35, 0.05, 0.05, 0.25),
    "int4": (0.75, 1.50, 0.25, 0.30, 0.0),
}


def _with_wrong_scales(model):
    from fuelpipe.quant.modules import QuantLinear

    bad = copy.deepcopy(model)
    with torch.no_grad():
        for m in bad.modules():
            if isinstance(m, QuantLinear):  # bf16 has no scales: its values are the scale
                t = m.scales if m.scales is not None else m.q
                t.copy_(t.float() * 2.0)
    return bad


def run(inp: OracleInput) -> OracleResult:
    fmt = getattr(inp.model, "weight_format", None)
    if fmt is None or not fmt.quantized:
        return skipped(NAME, "the model's weights are not quantized (weights.dtype=int8|int4|bf16)")
    if inp.dense_model is None:
        return skipped(NAME, "no f32 model of the same checkpoint was supplied to compare against")
    kind = fmt.kind.value
    top1_min, max_err_max, mean_err_max, kl_max, greedy_min = TOLERANCES[kind]
    model = _with_wrong_scales(inp.model) if inp.fault is Fault.QUANT_WRONG_SCALE else inp.model
    dense = inp.dense_model()
    ref_ctx = inp.setup.with_backend("eager").context(dense, plan=PlanMode.plan_once)
    ctx = inp.setup.context(model)
    n = inp.new_tokens
    worst_max = worst_mean = worst_kl = 0.0
    agree = total = agree_all = total_all = 0
    greedy_shares = []
    for prompt in inp.prompts:
        ref_tokens, _ = greedy_run(ref_ctx, inp.cache(ref_ctx), prompt, n)
        ids = torch.tensor([list(prompt) + ref_tokens[:-1]])  # [1, T]: the f32 stream, teacher-forced
        want = dense.reference_logits(ids)[0, len(prompt) - 1:].float()  # [n, vocab]
        got = torch.stack([r.float() for r in forced_logits(ctx, inp.cache(ctx), prompt, ref_tokens)])  # [n, vocab]
        scale = float(want.std()) or 1.0
        err = (got - want).abs()
        worst_max = max(worst_max, float(err.max()) / scale)
        worst_mean = max(worst_mean, float(err.mean()) / scale)
        logp_want, logp_got = torch.log_softmax(want, -1), torch.log_softmax(got, -1)
        kl = float((logp_want.exp() * (logp_want - logp_got)).sum(-1).mean())
        worst_kl = max(worst_kl, kl)
        same_top = got.argmax(-1) == want.argmax(-1)  # [n]
        top2 = want.topk(2, dim=-1).values  # [n, 2]
        decisive = (top2[:, 0] - top2[:, 1]) > DECISIVE_MARGIN * scale
        agree += int((same_top & decisive).sum())
        total += int(decisive.sum())
        agree_all += int(same_top.sum())
        total_all += want.shape[0]
        q_tokens, _ = greedy_run(ctx, inp.cache(ctx), prompt, n)
        same = next((i for i, (a, b) in enumerate(zip(q_tokens, ref_tokens)) if a != b), n)
        greedy_shares.append(same / n)
    bounds_checked = check_model(model, dense, fmt)
    worst_bound = max(bounds_checked, key=lambda c: c.ratio)
    top1 = agree / total if total else 1.0
    greedy = min(greedy_shares)
    failures = []
    for label, value, bound, ok in (
        ("top1", top1, top1_min, top1 >= top1_min),
        ("max_err", worst_max, max_err_max, worst_max <= max_err_max),
        ("mean_err", worst_mean, mean_err_max, worst_mean <= mean_err_max),
        ("kl", worst_kl, kl_max, worst_kl <= kl_max),
        ("greedy_agree", greedy, greedy_min, greedy >= greedy_min),
    ):
        if not ok:
            failures.append(f"{label}={value:.4g} (allowed {'>=' if label in ('top1', 'greedy_agree') else '<='} {bound})")
    if not worst_bound.ok:
        over = [c for c in bounds_checked if not c.ok]
        failures.append(f"{len(over)} of {len(bounds_checked)} matrices miss their rounding bound (worst "
                        f"{worst_bound.name} {worst_bound.kind}: {worst_bound.ratio:.3g} x the bound)")
    metric = {"kind": fmt.label(), "bound_ratio": float(f"{worst_bound.ratio:.3g}"),
              "matrices_bounded": len(bounds_checked), "top1": round(top1, 4), "max_err": float(f"{worst_max:.3g}"),
              "mean_err": float(f"{worst_mean:.3g}"), "kl": float(f"{worst_kl:.3g}"), "greedy_agree": round(greedy, 3),
              "top1_all": round(agree_all / total_all, 4), "decisive": total, "positions": total_all, "prompts": len(inp.prompts)}
    bounds = (f"{kind} tolerances: top1>={top1_min} max_err<={max_err_max} mean_err<={mean_err_max} "
              f"kl<={kl_max} greedy_agree>={greedy_min} (errors relative to the f32 logits' std); every matrix within its "
              f"rounding bound (worst {worst_bound.ratio:.3g} x, {len(bounds_checked)} matrices)")
    detail = ("failed: " + "; ".join(failures) + f"; {bounds}") if failures else bounds
    return OracleResult(name=NAME, passed=not failures, metric=metric, tolerance=None, detail=detail)
