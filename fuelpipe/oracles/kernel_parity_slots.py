"""kernel_parity's slot-attention cases: shapes, masks, the poisoned slots and the derived bound.

The grid (inputs, fault, tally) is ``kernel_parity._Grid``; see that module's docstring for the bound.
"""
from __future__ import annotations

import torch

from fuelpipe.kv import slot_attention as readable_attention
from fuelpipe.oracles.base import OracleInput

U = 2.0 ** -24  # f32 unit roundoff


def _slot_shapes(inp: OracleInput) -> list[tuple[int, int, int, int, int, int]]:
    """(rows B, heads H, KV heads Hkv, queries T, head dim D, capacity S): the model's own, then edges."""
    d = inp.model.dims
    own = (3, d.n_heads, d.n_kv_heads, 1, d.head_dim, inp.max_seq_len)
    return [own, own[:3] + (4,) + own[4:], (3, 4, 1, 1, 12, 5), (2, 2, 2, 1, 8, 1), (4, 6, 2, 3, 20, 9)]


def _slot_mask(grid, b: int, t: int, s: int) -> torch.Tensor:
    """[b, 1, t, s] additive: row 0 full to capacity (causal over its t queries), row 1 one live slot (the last),
    row 2 one live slot (the first), further rows a random prefix with a few finite biases."""
    neg = float("-inf")
    mask = torch.full((b, 1, t, s), neg)
    for row in range(b):
        for q in range(t):
            if row == 0:
                mask[row, 0, q, :s - t + q + 1] = 0.0
            elif row in (1, 2):
                mask[row, 0, q, s - 1 if row == 1 else 0] = 0.0
            else:
                live = min(s, int(grid.randint(1, s + 1, 1)) + q)
                mask[row, 0, q, :live] = -0.5 * torch.rand(live, generator=grid.gen)
    return mask


def _attention_bound(q, k_rows, v_rows, mask, scale: float) -> torch.Tensor:
    """Per output element [B, H, T, Dv]: (4 E + (2 n + 8) u) max_j |v_j| over the attended slots j."""
    live = mask != float("-inf")  # [B, 1, T, S]
    group = q.shape[1] // k_rows.shape[1]
    k_rows = k_rows.repeat_interleave(group, dim=1)  # [B, H, S, D]
    v_rows = v_rows.repeat_interleave(group, dim=1)
    dots = torch.einsum("bhtd,bhsd->bhts", q.abs(), k_rows.abs()) * scale  # sum |q k|, scaled
    scores = torch.einsum("bhtd,bhsd->bhts", q, k_rows) * scale + torch.where(live, mask, 0.0)
    e = (q.shape[-1] + 2) * U * dots + U * scores.abs()
    e = torch.where(live, e, 0.0).amax(-1, keepdim=True)  # [B, H, T, 1]
    n = live.sum(-1, keepdim=True)  # [B, 1, T, 1]
    v_max = torch.where(live[..., None], v_rows[:, :, None].abs(), 0.0).amax(-2)  # [B, H, T, Dv]
    return (4 * e + (2 * n + 8) * U) * v_max


def slot_cases(grid, ops, inp: OracleInput) -> None:
    """slot_attention on the model's own shapes and edges (``_slot_shapes``), against its readable form."""
    if "slot_attention" not in grid.kernels:
        return
    for b, h, hkv, t, d, s in _slot_shapes(inp):
        n_slots = b + 1  # one slot no row reads: NaN throughout
        q = grid.randn(b, h, t, d)
        k_buf, v_buf = grid.randn(n_slots, hkv, s, d), grid.randn(n_slots, hkv, s, d)
        slot_ids = torch.randperm(n_slots, generator=grid.gen)[:b]
        mask = _slot_mask(grid, b, t, s)
        dead = ~(mask != float("-inf")).any(dim=2)  # [B, 1, S]: no query of the row attends
        unused = [i for i in range(n_slots) if i not in slot_ids.tolist()]
        for buf in (k_buf, v_buf):
            buf[unused] = float("nan")
            for row in range(b):
                buf[slot_ids[row], :, dead[row, 0]] = float("nan")
        scale = d ** -0.5
        fed = mask.clone()
        if grid.hide_last_slot:
            fed[..., -1] = float("-inf")
        got = ops.slot_attention(q, k_buf, v_buf, slot_ids, fed, scale)
        grid.tally.check("slot_attention", f"B={b} H={h} Hkv={hkv} T={t} D={d} S={s}", got,
                         _slot_reference, q, k_buf, v_buf, slot_ids, mask, scale)


def _slot_reference(q, k_buf, v_buf, slot_ids, mask, scale: float):
    """The readable form in float64, and its bound from the attended slots' keys and values."""
    want = readable_attention.slot_attention(q.double(), k_buf.double(), v_buf.double(), slot_ids, mask.double(), scale)
    dead = ~(mask != float("-inf")).any(dim=2, keepdim=True).transpose(-1, -2)  # [B, 1, S, 1]
    keys = torch.where(dead, 0.0, k_buf.index_select(0, slot_ids).double())  # [B, Hkv, S, D]
    values = torch.where(dead, 0.0, v_buf.index_select(0, slot_ids).double())
    return want, _attention_bound(q.double(), keys, values, mask.double(), scale)
