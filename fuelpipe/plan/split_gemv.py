"""Decode-step matrix-vector products split across the intra-op threads.

At decode a linear layer is a GEMV: every weight byte is read once for a
handful of flops, so its speed is the memory bandwidth it draws. On CPU a
single ``F.linear`` call on a layer-sized matrix runs on one core (measured
on this project's 2-core machine: 4-7 GB/s cold, one thread or two alike,
while two cores together stream 17 GB/s). Splitting the output rows into
``P`` equal parts and running them as one batched matmul puts every core on
its own part of the weight, concurrently.

Only matrices of at least ``MIN_SPLIT_ELEMENTS`` are split: for small ones
the cost of running every thread outweighs what they stream (tiny test models
are left as plain linears). The part count is the intra-op thread count when
the plan is built; a plan run later on a different thread count still computes
the same function, only its split no longer matches the threads.

Two layouts, chosen per shape when the plan is built:

* ``rows``: the weight viewed as ``[P, N/P, K]`` (no copy); each part is a
  row-major GEMV. Best when N is not much larger than K.
* ``cols``: a transposed copy ``[P, K, N/P]``; each part accumulates
  scaled rows of the weight, which streams long contiguous runs. Best for
  wide outputs (N >= 4K: gate/up projections, the vocabulary head).

``split_gemv`` is a registered operator, so inductor calls it as an opaque
kernel instead of lowering the batched matmul to a generic reduction (which
it does for matrix-vector shapes on CPU, and which is slower).
``reference_linear`` is the readable eager meaning of every variant.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

WIDE_RATIO = 4  # cols layout when out_features >= WIDE_RATIO * in_features
# Below this many weight elements a split costs more than it streams: waking every thread
# for a small matrix (and waiting on a busy core) outweighs the bandwidth it adds. 2**18
# elements is 1 MiB in f32; SmolLM2's smallest projection (576 x 576) is just above it.
MIN_SPLIT_ELEMENTS = 2**18


def worth_splitting(weight: torch.Tensor, parts: int, on_cpu: bool = False) -> bool:
    """Split only on CPU (``on_cpu``: the caller knows, for a weight not yet made), across >= 2 parts that
    divide the outputs, and for matrices big enough to pay."""
    n = weight.shape[0]
    return ((on_cpu or weight.device.type == "cpu") and parts >= 2 and n % parts == 0
            and weight.numel() >= MIN_SPLIT_ELEMENTS)


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """What every split layout computes: x [.., K] @ weight[N, K].T + bias -> [.., N]."""
    return F.linear(x, weight, bias)


def split_weight(weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, bool]:
    """(split weight, cols?) for ``weight`` [N, K]; rows is a view, cols a transposed copy."""
    n, k = weight.shape
    if n >= WIDE_RATIO * k:
        return weight.t().contiguous().view(k, parts, n // parts).permute(1, 0, 2).contiguous(), True  # [P, K, N/P]
    return weight.view(parts, n // parts, k), False  # [P, N/P, K]


def _split_gemv_impl(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], cols: bool) -> torch.Tensor:
    lead = x.shape[:-1]
    k = x.shape[-1]
    parts = w.shape[0]
    m = x.numel() // k
    if cols:  # w [P, K, n]
        y = torch.bmm(x.reshape(1, m, k).expand(parts, m, k), w)  # [P, M, n]
        if m > 1:
            y = y.transpose(0, 1)  # [M, P, n]
    else:  # w [P, n, K]
        y = torch.bmm(w, x.reshape(1, m, k).transpose(1, 2).expand(parts, k, m))  # [P, n, M]
        if m > 1:
            y = y.permute(2, 0, 1)  # [M, P, n]
    out = y.reshape(*lead, -1)  # [.., N]; a view when M == 1 (one decode token)
    return out + bias if bias is not None else out


# Registered through the low-level ``torch.library.Library`` API: its dispatch costs
# ~9 us a call here against ~40 us for ``torch.library.custom_op``'s wrapper, and a
# decode step makes ~120 of these calls.
_LIB = torch.library.Library("fuelpipe", "DEF")
_LIB.define("split_gemv(Tensor x, Tensor w, Tensor? bias, bool cols) -> Tensor")
_LIB.impl("split_gemv", _split_gemv_impl, "CompositeExplicitAutograd")


def _split_gemv_meta(x, w, bias, cols):
    n = w.shape[0] * (w.shape[2] if cols else w.shape[1])
    return x.new_empty((*x.shape[:-1], n))


_LIB.impl("split_gemv", _split_gemv_meta, "Meta")


def split_gemv(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], cols: bool) -> torch.Tensor:
    """x [.., K] times a split weight (see ``split_weight``) -> [.., N]."""
    return torch.ops.fuelpipe.split_gemv.default(x, w, bias, cols)
