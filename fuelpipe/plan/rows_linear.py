"""f32 linears on the model's own weights, read where they lie: no plan-time copy.

``rows_linear(x, parts, bias)`` multiplies ``x [.., K]`` by one or more row-major
matrices ``[N_i, K]`` that share ``K`` (a fused sibling group: q/k/v, gate/up) and
returns their outputs side by side, ``[.., sum N_i]``, as if the matrices were
concatenated along the output rows. Nothing is concatenated: the C++ kernel
(``fuelpipe/kernels/f32_rows.cpp``) reads each matrix where the model keeps it.
So a plan whose linears all run in this form holds no second copy of any
weight, and neither does the fusion of siblings.

Two recipes, both on the weights in place:

* the GEMV recipe (``f32_rows_linear``): each output is eight lanes over ``k``,
  summed in a fixed tree, the tail chained on. For few rows of x (decode, batch
  buckets). A thread walks four distant stretches of its rows in lockstep, so
  one core keeps four memory streams in flight.
* the prompt recipe (``f32_rows_chain_linear``, ``chain=True``): x is packed
  k-major once per call and each output is one sequential multiply-add chain
  over ``k`` (the panel kernel's chain, so its bits equal the panel kernel's).
  For many rows (a prompt).

Measured on SmolLM2-135M's shapes (all linears of one token, 2 threads, AMD
EPYC, AVX2), against the panel kernel on its packed copy: the GEMV recipe level
at 1 row (20.9 against 20.8 ms) and ahead at 8 (30.2 against 32.1); the prompt
recipe 1.1x slower at 16 rows and 1.16x at 32. The plan's measured pass
(``fuelpipe.plan.linear_forms``) picks the recipe per row count.

Within one recipe a row's result does not depend on how many rows share the
call nor on the thread count. ``reference_rows_linear`` is the readable meaning.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def reference_rows_linear(x: torch.Tensor, parts: Sequence[torch.Tensor],
                          bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What ``rows_linear`` computes (up to summation order): x [.., K] @ cat(parts)[N, K].T + bias -> [.., N]."""
    return F.linear(x, torch.cat(list(parts)), bias)


def rows_linear(x: torch.Tensor, parts: Sequence[torch.Tensor], bias: Optional[torch.Tensor] = None,
                chain: bool = False) -> torch.Tensor:
    """x [.., K] f32 (CPU) times the row-major matrices ``parts`` [N_i, K] -> [.., sum N_i]; builds the kernels on
    first use. Each part needs unit stride along K (any row stride: a column block of a wider matrix is fine).

    ``chain``: the prompt recipe (x packed k-major per call, one sequential chain per output) instead of the
    GEMV recipe (eight lanes over k). Both read the weights in place; they differ in rounding only."""
    from fuelpipe.kernels.build import load

    load()
    op = torch.ops.fuelpipe_kernels.f32_rows_chain_linear if chain else torch.ops.fuelpipe_kernels.f32_rows_linear
    return op(x, list(parts), bias)
