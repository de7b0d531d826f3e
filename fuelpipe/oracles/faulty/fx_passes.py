"""NAIVE_DCE and SPLIT_PARTS_INTERLEAVED: fx passes that are wrong on purpose, and the linear forms they emit.

None of them is registered (``fuelpipe.plan.fx_passes.FX_PASSES`` holds the correct passes only), so a
config cannot name one: the validator answers with the real passes. A negative control hands its pass to
the build by value instead: ``passes_under(fault, passes)`` puts the ``FxPass`` in place of the correct
pass's name in a ``BackendSpec``'s pass list.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.fx as fx
from torch import nn

from fuelpipe.oracles.faults import Fault
from fuelpipe.plan.derived_weights import derived
from fuelpipe.plan.fx_passes import FxPass, all_in_form
from fuelpipe.plan.linear_forms import FORMS, LinearForm, sources_of, weight_of
from fuelpipe.plan.panels import pack_panels
from fuelpipe.plan.split_gemv import WIDE_RATIO


def naive_eliminate_dead_code(gm: fx.GraphModule) -> int:
    """torch.fx's default DCE: an in-place KV write whose result is unused is dropped as dead code."""
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return before - len(gm.graph.nodes)


# ---- wrong weight layouts ---------------------------------------------------------------
def split_weight_interleaved(weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, bool]:
    """Part p holds rows p, p + P, ... (strided), while ``split_gemv`` assembles its parts as contiguous
    blocks, so the outputs come back permuted (``fuelpipe.plan.split_gemv.split_weight`` is the right one)."""
    n, k = weight.shape
    strided = weight.view(n // parts, parts, k).transpose(0, 1)  # [P, N/P, K]: part p = rows p::P
    if n >= WIDE_RATIO * k:
        return strided.transpose(1, 2).contiguous(), True  # [P, K, N/P]
    return strided.contiguous(), False


def pack_panels_misordered(weight: torch.Tensor) -> torch.Tensor:
    """Each panel's 16 columns stored in reverse order, so the panel kernel's outputs come back permuted
    within every group of 16 (``fuelpipe.plan.panels.pack_panels`` is the right one)."""
    return pack_panels(weight).flip(-1).contiguous()


def _interleaved_copy(lin: nn.Linear) -> tuple[torch.Tensor, bool]:
    parts, shape = torch.get_num_threads(), lin.weight.shape
    w = derived(f"split_weight_interleaved/{parts}", sources_of(lin),
                lambda: split_weight_interleaved(weight_of(lin), parts)[0])
    return w, shape[0] >= WIDE_RATIO * shape[1]


def _misordered_copy(lin: nn.Linear) -> tuple[torch.Tensor, int]:
    shape = lin.weight.shape
    tag = f"pack_panels_misordered/{'x'.join(map(str, shape))}"
    return derived(tag, sources_of(lin), lambda: pack_panels_misordered(weight_of(lin))), shape[0]


def _rows_parts_rotated(lin: nn.Linear) -> tuple[list[torch.Tensor], None]:
    """Each part given as its rows 1.. then row 0 (views, no copy), so every part's outputs come back
    rotated by one."""
    parts = []
    for t in sources_of(lin):
        t = t.detach()
        parts += [t[1:], t[:1]] if t.shape[0] > 1 else [t]
    return parts, None


# Each correct form with its weight laid out wrong: the outputs assembled in the wrong order.
FAULTY_FORMS: dict[str, LinearForm] = {
    "split_gemv": replace(FORMS["split_gemv"], name="split_gemv_interleaved", weight=_interleaved_copy),
    "panels": replace(FORMS["panels"], name="panels_misordered", weight=_misordered_copy),
    "rows": replace(FORMS["rows"], name="rows_rotated", weight=_rows_parts_rotated),
    "rows_chain": replace(FORMS["rows_chain"], name="rows_chain_rotated", weight=_rows_parts_rotated),
}


# ---- the passes -------------------------------------------------------------------------
def split_linears_across_threads_interleaved(gm: fx.GraphModule) -> int:
    """``split_linears_across_threads`` with parts filled strided and assembled as blocks."""
    return all_in_form(gm, FAULTY_FORMS["split_gemv"], rows=1)


def pack_linears_into_panels_misordered(gm: fx.GraphModule) -> int:
    """``pack_linears_into_panels`` with each panel's columns reversed."""
    return all_in_form(gm, FAULTY_FORMS["panels"], rows=1, require=True)


def run_linears_on_model_weights_rotated(gm: fx.GraphModule) -> int:
    """``run_linears_on_model_weights`` with each part's rows rotated."""
    return all_in_form(gm, FAULTY_FORMS["rows"], rows=1, require=True)


def chain_linears_on_model_weights_rotated(gm: fx.GraphModule) -> int:
    """``chain_linears_on_model_weights`` (the prompt recipe) with each part's rows rotated."""
    return all_in_form(gm, FAULTY_FORMS["rows_chain"], rows=2, require=True)


# The faulty pass each fault puts in place of a correct one (by the correct pass's name).
FAULTY_PASSES: dict[Fault, dict[str, FxPass]] = {
    Fault.NAIVE_DCE: {
        "eliminate_dead_code_keeping_writes": FxPass("naive_eliminate_dead_code", naive_eliminate_dead_code),
    },
    Fault.SPLIT_PARTS_INTERLEAVED: {
        "split_linears_across_threads": FxPass("split_linears_across_threads_interleaved",
                                               split_linears_across_threads_interleaved),
        "pack_linears_into_panels": FxPass("pack_linears_into_panels_misordered", pack_linears_into_panels_misordered),
        "run_linears_on_model_weights": FxPass("run_linears_on_model_weights_rotated",
                                               run_linears_on_model_weights_rotated),
        "chain_linears_on_model_weights": FxPass("chain_linears_on_model_weights_rotated",
                                                 chain_linears_on_model_weights_rotated),
    },
}


def passes_under(fault: Fault, passes: tuple) -> tuple:
    """``passes`` with the fault's faulty pass in place of the correct one (unchanged for other faults)."""
    swap = FAULTY_PASSES.get(fault, {})
    return tuple(swap.get(p, p) for p in passes)
