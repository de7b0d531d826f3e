"""Optimisation passes over the traced decode-step graph.

* ``fuse_sibling_linears``: linears that read the same input (q/k/v, gate/up)
  become one matmul over concatenated weights followed by a split: fewer
  dispatches and one pass over the input. The fused weights are copies made
  at build time (shared by every plan built from the same weights, see
  ``derived_weights``); the plan key carries the weights' identity so an
  in-place weight update invalidates the plan instead of serving stale copies.
* ``split_linears_across_threads``: every CPU linear becomes a GEMV split
  into one part per intra-op thread (``fuelpipe.plan.split_gemv``), so all
  cores stream weights at once. Run after the fusion so fused weights split too.
* ``transpose_linears_for_gemm``: the batch-step counterpart of the split (a plan
  whose linears see several rows): ``x @ W^T`` against a contiguous transposed copy.
* ``pack_linears_into_panels``: every CPU f32 linear through the C++ panel kernel
  (``fuelpipe.plan.panels``), for one row or a batch's B rows.
* ``measured_linears`` (the default): each linear in whichever of those forms (or
  plain ``F.linear``) measured fastest on this CPU at the step's row count
  (``fuelpipe.plan.linear_forms``).
* ``slot_attention_kernel``: a batch-slot step's attention (``fuelpipe.kv.slot_attention``,
  one traced call) through the C++ kernel that reads each row's slot in place instead of
  gathering the rows' slots into a copy. Not applied when the kernels cannot be built here.
* ``eliminate_dead_code_keeping_writes``: dead-code elimination that treats
  in-place ops (KV writes) as side effects. torch.fx's default predicate
  drops an in-place write whose result is unused; that would silently stop
  the cache from being written (see the negative control in the tests).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch import nn

from fuelpipe.registry import Registry
from fuelpipe.plan.derived_weights import derived
from fuelpipe.plan.linear_forms import FORMS, measured_linears, measured_linears_allowing_copies
from fuelpipe.plan.linear_rewrite import linear_of, rewrite_all
from fuelpipe.plan import split_gemv  # noqa: F401  (registers torch.ops.fuelpipe.split_gemv)


def is_inplace(node: fx.Node) -> bool:
    if node.op == "call_method" and isinstance(node.target, str):
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return name.endswith("_") and not name.endswith("__") or node.target is operator.setitem
    return False


def eliminate_dead_code_keeping_writes(gm: fx.GraphModule) -> int:
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or is_inplace(n))
    gm.recompile()
    return before - len(gm.graph.nodes)


def fuse_sibling_linears(gm: fx.GraphModule) -> int:
    """Fuse every group of >= 2 bias-compatible linears sharing one input. Returns groups fused."""
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        lin = linear_of(gm, node)
        if lin is not None:
            groups.setdefault(node.args[0], []).append(node)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    fused = 0
    for src, nodes in groups.items():
        if len(nodes) < 2:
            continue
        mods = [linear_of(gm, n) for n in nodes]
        has_bias = {m.bias is not None for m in mods}
        kinds = {(m.in_features, m.weight.dtype, m.weight.device) for m in mods}
        if len(has_bias) != 1 or len(kinds) != 1:
            continue
        nodes.sort(key=order.__getitem__)
        sizes = [m.out_features for m in mods]
        in_features, dtype, device = kinds.pop()
        # The fused weight stays on ``meta``: a form that reads the parts where they lie (``rows``) never
        # concatenates them; one that needs the concatenation makes it (``linear_forms.weight_of``), and
        # ``trace_step`` makes it for any fused linear still called as a module after the passes.
        big = nn.Linear(in_features, sum(sizes), bias=has_bias.pop(), device="meta", dtype=dtype)
        with torch.no_grad():
            weights = [m.weight for m in mods]
            big.weight.requires_grad_(False)
            big.fuelpipe_sources = weights  # later passes key their copies on the model's own tensors
            big.register_forward_pre_hook(_make_weight_on_first_call)  # the graph runs between passes too
            if big.bias is not None:
                biases = [m.bias for m in mods]
                b = derived("fused", biases, lambda: torch.cat([t.detach() for t in biases]).to(device))
                big.bias = nn.Parameter(b, requires_grad=False)
        name = f"fused_linear_{fused}"
        gm.add_submodule(name, big)
        with gm.graph.inserting_before(nodes[0]):
            out = gm.graph.call_module(name, (src,))
            parts = gm.graph.call_function(torch.split, (out, sizes), {"dim": -1})
            for i, node in enumerate(nodes):
                piece = gm.graph.call_function(operator.getitem, (parts, i))
                node.replace_all_uses_with(piece)
        for node in nodes:
            gm.graph.erase_node(node)
        fused += 1
    fused += _fuse_packed_siblings(gm)
    gm.graph.lint()
    gm.recompile()
    return fused


def _make_weight_on_first_call(mod: nn.Linear, args) -> None:
    """A lazy fused linear called as a module (no pass took it yet) makes its concatenated weight once."""
    from fuelpipe.plan.linear_forms import is_lazy, weight_of

    if is_lazy(mod):
        mod.weight = nn.Parameter(weight_of(mod), requires_grad=False)


def _packed_ops() -> dict:
    """Packed low-bit matrix operators (fuelpipe.kernels) -> the positions of their weight tensors."""
    ns = getattr(torch.ops, "fuelpipe_kernels", None)
    out = {}
    for name, weights in (("q8_gemv", (1, 2)), ("q4_gemv", (1, 2, 3)), ("q8_gemv_a16", (1, 2)),
                          ("q4_gemv_a16", (1, 2, 3)), ("q8_gemv_a8", (1, 2)), ("q4_gemv_a8", (1, 2, 3)),
                          ("bf16_gemv", (1,))):
        try:
            out[getattr(ns, name).default] = weights
        except (AttributeError, RuntimeError):
            pass
    return out


def _fuse_packed_siblings(gm: fx.GraphModule) -> int:
    """Packed matrices reading one input (q/k/v, gate/up of a quantized model) become one call.

    Their packed buffers are concatenated along the output rows (copies shared through
    ``derived_weights``), so every sibling group costs one kernel call instead of several.
    Only groups with the same operator, no bias and equal group sizes are fused.
    """
    ops = _packed_ops()
    groups: dict[tuple, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in ops or node.kwargs:
            continue
        positions = ops[node.target]
        if node.args[-1] is not None or not all(isinstance(node.args[i], fx.Node) and node.args[i].op == "get_attr"
                                                for i in positions):
            continue
        tensors = [_attr(gm, node.args[i].target) for i in positions]
        shape_of = tuple((t.shape[1:], t.dtype) for t in tensors)
        groups.setdefault((node.target, node.args[0], shape_of), []).append(node)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    fused = 0
    for (op, src, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        nodes.sort(key=order.__getitem__)
        positions = ops[op]
        sizes = [_attr(gm, n.args[1].target).shape[0] for n in nodes]
        new_args = list(nodes[0].args)
        for i in positions:
            parts = [_attr(gm, n.args[i].target) for n in nodes]
            name = f"fused_packed_{fused}_{i}"
            gm.register_buffer(name, derived("fused", parts, lambda parts=parts: torch.cat([t.detach() for t in parts])))
            with gm.graph.inserting_before(nodes[0]):
                new_args[i] = gm.graph.get_attr(name)
        with gm.graph.inserting_before(nodes[0]):
            out = gm.graph.call_function(op, tuple(new_args))
            split = gm.graph.call_function(torch.split, (out, sizes), {"dim": -1})
            for j, node in enumerate(nodes):
                node.replace_all_uses_with(gm.graph.call_function(operator.getitem, (split, j)))
        for node in nodes:
            gm.graph.erase_node(node)
        fused += 1
    return fused


def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    return operator.attrgetter(target)(gm)  # a get_attr node's dotted target


def split_linears_across_threads(gm: fx.GraphModule) -> int:
    """Replace each large CPU ``nn.Linear`` by a GEMV split into one part per intra-op thread. Returns count.

    The replaced linears (including fused ones) are dropped from the graph module, so the
    plan holds one copy of each weight, not two.
    """
    return all_in_form(gm, FORMS["split_gemv"], rows=1)


def transpose_linears_for_gemm(gm: fx.GraphModule) -> int:
    """Replace each CPU ``nn.Linear`` by ``x @ W^T`` against a contiguous transposed copy. Returns count.

    For a step with several rows (a batch) every linear is a small GEMM, and on CPU
    ``F.linear``'s transposed-weight GEMM runs at about half the speed of a plain one
    (measured on SmolLM2's shapes at 8 rows). The copies are shared by every plan built
    from the same weights (``derived_weights``), so all of a batch's bucket plans hold one set.
    """
    return all_in_form(gm, FORMS["gemm_transposed"], rows=2)


def pack_linears_into_panels(gm: fx.GraphModule) -> int:
    """Run each CPU f32 ``nn.Linear`` through the panel kernel (``fuelpipe.plan.panels``). Returns count."""
    return all_in_form(gm, FORMS["panels"], rows=1, require=True)


def run_linears_on_model_weights(gm: fx.GraphModule) -> int:
    """Run each CPU f32 ``nn.Linear`` through the C++ kernel on the model's own weights
    (``fuelpipe.plan.rows_linear``): no copy, a fused group on its parts where they lie. Returns count."""
    return all_in_form(gm, FORMS["rows"], rows=1, require=True)


def chain_linears_on_model_weights(gm: fx.GraphModule) -> int:
    """``run_linears_on_model_weights`` in the prompt recipe (``rows_linear(chain=True)``). Returns count."""
    return all_in_form(gm, FORMS["rows_chain"], rows=2, require=True)


def all_in_form(gm: fx.GraphModule, form, rows: int, require: bool = False) -> int:
    """Rewrite every linear that ``form`` can run at ``rows`` rows into it (``require``: the C++ kernels must
    build here, a typed error otherwise). Returns how many."""
    threads = torch.get_num_threads()
    if require:
        _require_kernels()
    return rewrite_all(gm, lambda lin: form if form.usable(lin, rows, threads) else None)


def slot_attention_kernel(gm: fx.GraphModule) -> int:
    """Every ``slot_attention`` call becomes ``fast_slot_attention`` (the C++ kernel for float32 on the CPU,
    the readable form otherwise). Returns how many; 0, leaving the graph as it was, when the kernels
    cannot be built on this machine (``fuelpipe.plan.panels.kernels_available`` says why)."""
    from fuelpipe.kv import slot_attention as attention
    from fuelpipe.plan.panels import kernels_available

    sites = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is attention.slot_attention]
    if not sites or kernels_available() is not None:
        return 0
    for node in sites:
        node.target = attention.fast_slot_attention
    gm.graph.lint()
    gm.recompile()
    return len(sites)


def _require_kernels() -> None:
    from fuelpipe.kernels.build import load

    load()  # a typed KernelBuildError when this machine cannot build them


@dataclass(frozen=True)
class FxPass:
    """A graph pass, registered by name (``fuelpipe.fx_passes`` entry points; ``backend.fx_passes`` lists names).

    ``run`` rewrites the traced step graph in place and returns how many sites it changed
    (``run(gm, rows)`` when ``takes_rows``). A ``BackendSpec``'s pass list may also carry an ``FxPass``
    by value, in place of a name: a pass that is not registered, so no config can name it (``fx_pass``).
    """

    name: str
    run: Callable[..., int]
    takes_rows: bool = False  # run(gm, rows): the rows each linear sees per call (1, or a batch's B)
    # run(gm, rows, sequences=n): also how many sequences the step serves (what the head sees), when known
    takes_sequences: bool = False


BUILTIN_PASSES = (
    FxPass("fuse_sibling_linears", fuse_sibling_linears),
    FxPass("split_linears_across_threads", split_linears_across_threads),
    FxPass("eliminate_dead_code_keeping_writes", eliminate_dead_code_keeping_writes),
    FxPass("transpose_linears_for_gemm", transpose_linears_for_gemm),
    FxPass("pack_linears_into_panels", pack_linears_into_panels),
    FxPass("run_linears_on_model_weights", run_linears_on_model_weights),
    FxPass("chain_linears_on_model_weights", chain_linears_on_model_weights),
    FxPass("measured_linears_allowing_copies", measured_linears_allowing_copies, takes_rows=True,
           takes_sequences=True),
    FxPass("measured_linears", measured_linears, takes_rows=True, takes_sequences=True),
    FxPass("slot_attention_kernel", slot_attention_kernel),
)
FX_PASSES: Registry[FxPass] = Registry("fuelpipe.fx_passes", "fx pass", FxPass)


def fx_pass(entry: str | FxPass) -> FxPass:
    """The pass an entry of a pass list means: a registered pass by its name, or an ``FxPass`` given by value."""
    return entry if isinstance(entry, FxPass) else FX_PASSES.get(entry)


# The explicit forms the measured pass chooses among that have a pass of their own (config_variants
# runs each of them, so a form the measurement did not pick on this machine is still checked).
MEASURED_FORM_PASSES = ("split_linears_across_threads", "pack_linears_into_panels", "run_linears_on_model_weights",
                        "chain_linears_on_model_weights")


# What a GEMV-only pass becomes in a plan whose linears see several rows (a batch step):
# splitting a matrix-vector product across threads pays; a GEMM wants a plain weight layout.
GEMM_INSTEAD = {"split_linears_across_threads": "transpose_linears_for_gemm"}


def passes_for_rows(passes: tuple[str | FxPass, ...], rows: int) -> tuple[str | FxPass, ...]:
    """``passes`` for a step whose linears see ``rows`` rows per call (batch x tokens)."""
    return tuple(passes) if rows == 1 else tuple(GEMM_INSTEAD.get(p, p) for p in passes)
