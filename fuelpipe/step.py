"""The decode step every family runs: embed, per-layer apply, final norm + head.

One function, ``run_step``, for all families and every KV layout, and one ``nn.Module``,
``Step``, built from a layout's ``StepSignature`` (``fuelpipe.kv.layout``): the signature fixes
the program's inputs so a backend (fx / inductor / aot) sees stable, re-bindable tensors, and
makes the per-layer KV views from them. The inputs a signature may name:

    token_ids  [B, T]                      int64
    rope_cos   [n_rope_specs, B, T, rot]   model dtype
    rope_sin   [n_rope_specs, B, T, rot]   model dtype
    mask       [n_mask_variants, B, 1, T, S] model dtype (additive)
    write_index [T] int64              (tensor-offset and latent paths; B = 1)
                [B*T] int64            (paged paths: flattened pool offsets)
                [B, T] int64           (batch-slot paths: the position each row writes)
    slot_ids   [B] int64               (batch-slot paths: the cache slot each row owns)
    cached_len, attended_len  int      (symbol paths; a batch's attended_len is its longest row's)
    block_table [B, max_blocks_cap]    int64 (paged paths)
    kv         [k0, v0, k1, v1, ...]   the KV buffers the program is bound to

A packed prompt step (``packed*`` kinds, ``fuelpipe.batch.packed_prefill``)
runs several fresh sequences' prompts as one row of N tokens (B = 1, T = N):
write_index and slot_ids are per token [N], the mask [V, 1, 1, N, N] is
block-diagonal causal, and ``last_index [n]`` names each prompt's last token,
whose logits it returns.

One sequence is B = 1. A batch step (``batch*`` kinds) serves B rows of
different lengths at once (ragged); every row has its own positions, RoPE
rows, masks, write offsets and slot or block-table row.

Weights are the program's baked state; KV buffers are its bound state and are
written in place.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from fuelpipe.backbone import DecodeBackbone, LayerInputs
from fuelpipe.kv.layout import COMMON_INPUTS, StepSignature, signature_named


def run_step(
    backbone: DecodeBackbone,
    token_ids: torch.Tensor,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    mask: torch.Tensor,
    kv_views: list,
    last_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of each row's last position, [B, vocab] f32; with ``last_index [n]`` (a packed step, B = 1),
    of those positions of the one row, [n, vocab] f32."""
    n_specs = len(backbone.rope_plan.specs)
    cos = [rope_cos[i][:, None] for i in range(n_specs)]  # each [B, 1, T, rot]: broadcast over heads
    sin = [rope_sin[i][:, None] for i in range(n_specs)]
    masks = [mask[i] for i in range(len(backbone.mask_plan.variants))]  # each [B, 1, T, S]
    layer_spec = backbone.rope_plan.layer_spec
    layer_variant = backbone.mask_plan.layer_variant
    h = backbone.embed(token_ids)  # [B, T, hidden]
    for i in range(backbone.dims.n_layers):
        inputs = LayerInputs(
            cos=cos[layer_spec[i]], sin=sin[layer_spec[i]], mask=masks[layer_variant[i]], kv=kv_views[i]
        )
        h = backbone.apply_layer(i, h, inputs)
    logits = backbone.final(last_positions(h, last_index))  # [B or n, 1, vocab]
    return logits[:, 0, :].float()


def last_positions(h: torch.Tensor, last_index: torch.Tensor | None) -> torch.Tensor:
    """h [B, T, hidden] -> [B, 1, hidden], each row's last position; with ``last_index [n]`` (a packed step,
    B = 1) those positions of the one row, [n, 1, hidden]. An fx leaf: a pass can tell that what follows
    (the head) sees one row per sequence, not one per token (``fuelpipe.plan.linear_forms``)."""
    return h[:, -1:, :] if last_index is None else h[0].index_select(0, last_index)[:, None, :]


torch.fx.wrap("last_positions")


class Step(nn.Module):
    """A decode step with one signature's inputs: ``forward(token_ids, rope_cos, rope_sin, mask, *inputs, kv)``.

    ``forward`` is written per signature (``_step_class``) so tracing sees one named placeholder per input.
    """

    def __init__(self, backbone: DecodeBackbone, signature: StepSignature) -> None:
        super().__init__()
        self.backbone = backbone
        self.signature = signature

    def run(self, token_ids, rope_cos, rope_sin, mask, named: list, kv: list) -> torch.Tensor:
        inputs = dict(zip(self.signature.inputs, named))
        views = self.signature.views(self.backbone, inputs, kv)
        live_memo: dict = {}  # one per call: each mask's live slots computed once for all layers
        for view in views:
            view.live_memo = live_memo
        return run_step(self.backbone, token_ids, rope_cos, rope_sin, mask, views, inputs.get("last_index"))


@functools.lru_cache(maxsize=None)
def _step_class(inputs: tuple[str, ...]) -> type:
    """The ``Step`` subclass whose ``forward`` takes exactly these inputs (after the common four, before kv)."""
    params = ", ".join(COMMON_INPUTS + inputs + ("kv",))
    source = (f"def forward(self, {params}):\n"
              f"    return self.run({', '.join(COMMON_INPUTS)}, [{', '.join(inputs)}], kv)\n")
    namespace: dict = {}
    exec(source, {}, namespace)  # a signature with named parameters, as namedtuple writes its __new__
    return type("Step_" + "_".join(inputs), (Step,), {"forward": namespace["forward"]})


def step_module_for(backbone: DecodeBackbone, signature: StepSignature | str) -> nn.Module:
    sig = signature if isinstance(signature, StepSignature) else signature_named(signature)
    return _step_class(sig.inputs)(backbone, sig)


def step_args(signature: StepSignature | str, buffers, host, kv: list) -> tuple:
    """The program's positional arguments for one call, in its signature's order."""
    sig = signature if isinstance(signature, StepSignature) else signature_named(signature)
    return sig.arguments(buffers, host, kv)
