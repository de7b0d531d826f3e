"""How a plan runs each f32 linear on CPU, chosen by measuring the candidates on the CPU that builds the plan.

A linear layer can run in several forms, and which is fastest depends on the CPU
(AVX2 or AVX-512, cache sizes, memory bandwidth), the thread count and how many
rows the step feeds it (1 for single-stream decode, B for a batch step). A table
tuned on one machine was measured 1.39x slower on another, so nothing here is
assumed: ``measured_linears`` times every usable form on the plan's own weight
matrices at the plan's own row count and keeps the fastest, per shape.

Forms (each a rewrite of an ``nn.Linear`` call in the traced step):

* ``linear``: ``F.linear`` as traced (no copy);
* ``split_gemv``: the output rows split across the intra-op threads
  (``fuelpipe.plan.split_gemv``; one row only);
* ``gemm_transposed``: ``x @ W^T`` against a contiguous transposed copy (several rows);
* ``panels``: the C++ panel kernel (``fuelpipe.plan.panels``), any row count.

Timing sweeps same-shape weights of the step in order (up to ``SWEEP_BYTES`` of
them: more than a last-level cache holds), so each form is timed streaming
from memory as in a real step, best of a few sweeps. Choices are
cached per (shape, rows, threads, candidates) for the process: a replan build
every token re-measures nothing, and plan_once and replan plans agree.
Linears under ``MEASURE_MIN_ELEMENTS`` stay ``F.linear`` unmeasured: timing a
microsecond call is noise, and a noisy choice would make two processes build
plans that differ in low bits. ``timer`` is injectable, so a test can show that
a different measurement makes a different choice.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from fuelpipe.plan.derived_weights import derived
from fuelpipe.plan.panels import kernels_available, pack_panels, pack_panels_misordered, panel_linear
from fuelpipe.plan.split_gemv import WIDE_RATIO, split_weight, split_weight_interleaved, worth_splitting

Runner = Callable[[torch.Tensor], torch.Tensor]


def linear_of(gm: fx.GraphModule, node: fx.Node) -> Optional[nn.Linear]:
    """The plain ``nn.Linear`` a ``call_module`` node runs with one positional input, or None."""
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
        return None
    mod = gm.get_submodule(node.target)
    return mod if type(mod) is nn.Linear else None


def sources_of(lin: nn.Linear) -> list[torch.Tensor]:
    """The model tensors a (possibly fused) linear's weight was made from: the key its derived copies share."""
    return list(getattr(lin, "fuelpipe_sources", None) or [lin.weight])


@dataclass(frozen=True)
class LinearForm:
    """One way to run a linear. ``weight(lin)`` derives (and shares) the form's weight copy;
    ``call(x, w, bias)`` runs it; ``usable(lin, rows, threads)`` says whether it applies."""

    name: str
    usable: Callable[[nn.Linear, int, int], bool]
    weight: Callable[[nn.Linear], object]  # a tensor, or (tensor, static argument baked into the call)
    call: Callable[..., torch.Tensor]  # (x, weight-object, bias) -> y, eagerly (measuring, the readable form)
    # (graph, x, weight buffer, static argument, bias buffer or None) -> the node computing y, in a traced graph
    emit: Optional[Callable[..., fx.Node]] = None

    def runner(self, lin: nn.Linear) -> Runner:
        w, b = self.weight(lin), (lin.bias.detach() if lin.bias is not None else None)
        return lambda x: self.call(x, w, b)


# ---- the forms ------------------------------------------------------------------------------------

def _cpu_f32(lin: nn.Linear) -> bool:
    return lin.weight.device.type == "cpu" and lin.weight.dtype == torch.float32


def _split_copy(lin: nn.Linear, splitter=split_weight) -> tuple[torch.Tensor, bool]:
    parts, weight = torch.get_num_threads(), lin.weight
    w = derived(f"{splitter.__name__}/{parts}", sources_of(lin), lambda: splitter(weight.detach(), parts)[0])
    return w, weight.shape[0] >= WIDE_RATIO * weight.shape[1]


def _panels_copy(lin: nn.Linear, packer=pack_panels) -> tuple[torch.Tensor, int]:
    weight = lin.weight
    tag = f"{packer.__name__}/{'x'.join(map(str, weight.shape))}"
    return derived(tag, sources_of(lin), lambda: packer(weight.detach())), weight.shape[0]


def _split_call(x, w, b):
    return torch.ops.fuelpipe.split_gemv.default(x, w[0], b, w[1])


def _panels_call(x, w, b):
    return panel_linear(x, w[0], w[1], b)


def _gemm_call(x, w, b):
    y = torch.matmul(x, w)
    return y if b is None else y + b


def _split_emit(g: fx.Graph, x, w, wide, b):
    return g.call_function(torch.ops.fuelpipe.split_gemv.default, (x, w, b, wide))


def _panels_emit(g: fx.Graph, x, w, out_features, b):
    return g.call_function(torch.ops.fuelpipe_kernels.f32_panel_linear.default, (x, w, out_features, b))


def _gemm_emit(g: fx.Graph, x, w, _static, b):
    y = g.call_function(torch.matmul, (x, w))
    return y if b is None else g.call_function(operator.add, (y, b))


FORMS: dict[str, LinearForm] = {
    "linear": LinearForm("linear", lambda lin, rows, threads: True, lambda lin: lin.weight.detach(),
                         lambda x, w, b: F.linear(x, w, b)),  # the traced call as it is: nothing to emit
    "split_gemv": LinearForm(
        "split_gemv", lambda lin, rows, threads: rows == 1 and worth_splitting(lin.weight, threads),
        _split_copy, _split_call, _split_emit),
    "gemm_transposed": LinearForm(
        "gemm_transposed", lambda lin, rows, threads: rows > 1 and lin.weight.device.type == "cpu",
        lambda lin: derived("transposed", sources_of(lin), lambda: lin.weight.detach().t().contiguous()), _gemm_call,
        _gemm_emit),
    "panels": LinearForm("panels", lambda lin, rows, threads: _cpu_f32(lin) and kernels_available() is None,
                         _panels_copy, _panels_call, _panels_emit),
}
# The negative control's forms (Fault.SPLIT_PARTS_INTERLEAVED): outputs assembled in the wrong order.
FAULTY_FORMS: dict[str, LinearForm] = {
    "split_gemv": LinearForm("split_gemv_interleaved", FORMS["split_gemv"].usable,
                             lambda lin: _split_copy(lin, split_weight_interleaved), _split_call, _split_emit),
    "panels": LinearForm("panels_misordered", FORMS["panels"].usable,
                         lambda lin: _panels_copy(lin, pack_panels_misordered), _panels_call, _panels_emit),
}


# ---- rewriting a graph ----------------------------------------------------------------------------

def rewrite(gm: fx.GraphModule, node: fx.Node, lin: nn.Linear, form: LinearForm, index: int) -> None:
    """Replace the linear call ``node`` by ``form``'s call; its weight copy becomes a buffer of ``gm``."""
    if form.emit is None:  # F.linear: the traced call already is this form
        return
    w = form.weight(lin)
    weight, static = w if isinstance(w, tuple) else (w, None)
    with gm.graph.inserting_before(node):
        b_node = None
        if lin.bias is not None:
            gm.register_buffer(f"form_bias_{index}", lin.bias.detach())
            b_node = gm.graph.get_attr(f"form_bias_{index}")
        gm.register_buffer(f"form_weight_{index}", weight)
        out = form.emit(gm.graph, node.args[0], gm.graph.get_attr(f"form_weight_{index}"), static, b_node)
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)


def rewrite_all(gm: fx.GraphModule, choose: Callable[[nn.Linear], Optional[LinearForm]]) -> int:
    """Rewrite every linear for which ``choose`` names a form other than ``linear``. Returns how many."""
    done, index = 0, _first_free_index(gm)
    for node in list(gm.graph.nodes):
        lin = linear_of(gm, node)
        form = choose(lin) if lin is not None else None
        if form is None or form.emit is None:
            continue
        rewrite(gm, node, lin, form, index)
        done, index = done + 1, index + 1
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return done


def _first_free_index(gm: fx.GraphModule) -> int:
    """The first index no earlier rewrite of ``gm`` used for its buffers."""
    i = 0
    while hasattr(gm, f"form_weight_{i}") or hasattr(gm, f"form_bias_{i}"):
        i += 1
    return i


# ---- measuring ------------------------------------------------------------------------------------

SWEEP_BYTES = 64 * 2**20  # weights timed per shape: more than a last-level cache holds, so they stream


def time_form(form: LinearForm, lins: list[nn.Linear], rows: int, repeats: int = 2) -> float:
    """Best wall seconds per weight byte of a sweep of ``form`` over ``lins`` (all one shape) at ``rows`` rows.

    The sweep takes as many of ``lins`` as make ``SWEEP_BYTES`` (all when fewer): enough to stream
    from memory as a real step does, without deriving a losing form's copy of every weight."""
    per = lins[0].weight.numel() * lins[0].weight.element_size()
    lins = lins[: max(1, -(-SWEEP_BYTES // per))]
    runners = [form.runner(lin) for lin in lins]
    w = lins[0].weight
    x = torch.randn(rows, lins[0].in_features, generator=torch.Generator().manual_seed(0)).to(w.dtype)
    best = float("inf")
    with torch.no_grad():
        for r in range(repeats + 1):  # the first sweep warms (first touch of fresh copies, kernel load)
            t0 = time.perf_counter()
            for run in runners:
                run(x)
            if r:
                best = min(best, time.perf_counter() - t0)
    return best / (per * len(lins))


Timer = Callable[[LinearForm, list, int], float]
_CHOICES: dict[tuple, str] = {}
# Below this many weight elements (1 MiB in f32) a linear stays ``F.linear`` unmeasured: its call takes
# microseconds, a timing of it is noise, and a noisy choice would differ from process to process
# (the same plan computing other low bits in another run).
MEASURE_MIN_ELEMENTS = 2**18


def shape_class(lin: nn.Linear) -> tuple:
    return (lin.out_features, lin.in_features, lin.bias is not None, lin.weight.dtype, lin.weight.device.type)


def choose_forms(lins: list[nn.Linear], rows: int, timer: Timer = time_form,
                 candidates: tuple[str, ...] = tuple(FORMS)) -> dict[tuple, str]:
    """shape class -> the fastest usable form's name for ``lins`` at ``rows`` rows on this CPU (cached)."""
    threads = torch.get_num_threads()
    groups: dict[tuple, list[nn.Linear]] = {}
    for lin in lins:
        groups.setdefault(shape_class(lin), []).append(lin)
    chosen = {}
    for shape, group in groups.items():
        small = group[0].weight.numel() < MEASURE_MIN_ELEMENTS
        usable = ("linear",) if small else tuple(n for n in candidates if FORMS[n].usable(group[0], rows, threads))
        key = (shape, rows, threads, usable, timer)
        if key not in _CHOICES:
            if len(usable) == 1:
                _CHOICES[key] = usable[0]
            else:
                times = {n: timer(FORMS[n], group, rows) for n in usable}
                _CHOICES[key] = min(usable, key=times.__getitem__)
        chosen[shape] = _CHOICES[key]
    return chosen


def forget_choices() -> None:
    """Measure afresh at the next build (tests; a process whose CPU share changed)."""
    _CHOICES.clear()


def measured_linears(gm: fx.GraphModule, rows: int = 1, timer: Timer = time_form) -> int:
    """Run each linear of ``gm`` in the form measured fastest here, at ``rows`` rows. Returns linears rewritten."""
    lins = [lin for node in gm.graph.nodes if (lin := linear_of(gm, node)) is not None]
    if not lins:
        return 0
    chosen = choose_forms(lins, rows, timer)
    return rewrite_all(gm, lambda lin: FORMS[chosen[shape_class(lin)]])
