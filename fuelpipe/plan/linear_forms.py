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
* ``panels``: the C++ panel kernel (``fuelpipe.plan.panels``) on a packed copy, any row count;
* ``rows`` / ``rows_chain``: the C++ kernel on the model's own row-major weights
  (``fuelpipe.plan.rows_linear``; the GEMV recipe, and the prompt recipe for several rows),
  any row count, no copy; a fused sibling group runs on its parts where they lie.

Weights exist once: ``measured_linears`` chooses among the forms that read the
model's own tensors (``rows``, ``rows_chain``, and ``linear`` on an unfused
linear). ``measured_linears_allowing_copies`` lets the forms that hold a copy
(panels, split, transposed, and ``linear`` on a fused group, whose weight is
then concatenated) compete, and picks one only when it measures at least
``COPY_MIN_GAIN`` faster than the fastest form reading the model's own tensors.
A fused group's weight is made (``weight_of``) only by a form that needs it.
A chosen form replaces the traced call through ``fuelpipe.plan.linear_rewrite``.

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
from fuelpipe.plan.linear_rewrite import linear_of, rewrite_all
from fuelpipe.plan.panels import kernels_available, pack_panels, panel_linear
from fuelpipe.plan.rows_linear import rows_linear
from fuelpipe.plan.split_gemv import WIDE_RATIO, split_weight, worth_splitting

Runner = Callable[[torch.Tensor], torch.Tensor]


def sources_of(lin: nn.Linear) -> list[torch.Tensor]:
    """The model tensors a (possibly fused) linear's weight was made from: the key its derived copies share."""
    return list(getattr(lin, "fuelpipe_sources", None) or [lin.weight])


def is_lazy(lin: nn.Linear) -> bool:
    """A fused group's linear whose weight has not been made (``fuse_sibling_linears`` leaves it on ``meta``)."""
    return lin.weight.is_meta and bool(getattr(lin, "fuelpipe_sources", None))


def weight_of(lin: nn.Linear) -> torch.Tensor:
    """The linear's weight [out, in]: for a lazy fused group, its parts concatenated (a copy, shared by every
    plan built from the same parts through ``derived_weights``)."""
    if is_lazy(lin):
        parts = sources_of(lin)
        return derived("fused", parts, lambda: torch.cat([t.detach() for t in parts]))
    return lin.weight.detach()


def materialize_lazy_linears(gm: fx.GraphModule) -> int:
    """Give every lazy fused linear still called as a module its concatenated weight. Returns how many.

    Runs after the passes: a linear no pass rewrote (a dtype no kernel takes, a pass list without the
    measured pass) runs as ``F.linear`` on the fused weight."""
    done = 0
    for mod in gm.modules():
        if type(mod) is nn.Linear and is_lazy(mod):
            mod.weight = nn.Parameter(weight_of(mod), requires_grad=False)
            done += 1
    return done


@dataclass(frozen=True)
class LinearForm:
    """One way to run a linear. ``weight(lin)`` derives (and shares) the form's weight copy;
    ``call(x, w, bias)`` runs it; ``usable(lin, rows, threads)`` says whether it applies."""

    name: str
    usable: Callable[[nn.Linear, int, int], bool]
    # a tensor, or (tensor or list of tensors, static argument baked into the call)
    weight: Callable[[nn.Linear], object]
    call: Callable[..., torch.Tensor]  # (x, weight-object, bias) -> y, eagerly (measuring, the readable form)
    # (graph, x, weight buffer(s), static argument, bias buffer or None) -> the node computing y, in a traced graph
    emit: Optional[Callable[..., fx.Node]] = None
    # whether the plan would hold a second copy of this linear's weight in this form
    copies: Callable[[nn.Linear], bool] = lambda lin: True

    def runner(self, lin: nn.Linear) -> Runner:
        w, b = self.weight(lin), (lin.bias.detach() if lin.bias is not None else None)
        return lambda x: self.call(x, w, b)


# ---- the forms ------------------------------------------------------------------------------------

def device_of(lin: nn.Linear) -> torch.device:
    """Where the linear's weights live (a lazy fused group's weight sits on ``meta``: its parts say)."""
    return sources_of(lin)[0].device


def _cpu_f32(lin: nn.Linear) -> bool:
    return device_of(lin).type == "cpu" and lin.weight.dtype == torch.float32


def _split_copy(lin: nn.Linear) -> tuple[torch.Tensor, bool]:
    parts, shape = torch.get_num_threads(), lin.weight.shape
    w = derived(f"split_weight/{parts}", sources_of(lin), lambda: split_weight(weight_of(lin), parts)[0])
    return w, shape[0] >= WIDE_RATIO * shape[1]


def _panels_copy(lin: nn.Linear) -> tuple[torch.Tensor, int]:
    shape = lin.weight.shape
    tag = f"pack_panels/{'x'.join(map(str, shape))}"
    return derived(tag, sources_of(lin), lambda: pack_panels(weight_of(lin))), shape[0]


def _rows_parts(lin: nn.Linear) -> tuple[list[torch.Tensor], None]:
    return [t.detach() for t in sources_of(lin)], None


def _split_call(x, w, b):
    return torch.ops.fuelpipe.split_gemv.default(x, w[0], b, w[1])


def _panels_call(x, w, b):
    return panel_linear(x, w[0], w[1], b)


def _rows_call(x, w, b):
    return rows_linear(x, w[0], b)


def _rows_chain_call(x, w, b):
    return rows_linear(x, w[0], b, chain=True)


def _gemm_call(x, w, b):
    y = torch.matmul(x, w)
    return y if b is None else y + b


def _split_emit(g: fx.Graph, x, w, wide, b):
    return g.call_function(torch.ops.fuelpipe.split_gemv.default, (x, w, b, wide))


def _panels_emit(g: fx.Graph, x, w, out_features, b):
    return g.call_function(torch.ops.fuelpipe_kernels.f32_panel_linear.default, (x, w, out_features, b))


def _rows_emit(g: fx.Graph, x, parts, _static, b):
    return g.call_function(torch.ops.fuelpipe_kernels.f32_rows_linear.default, (x, list(parts), b))


def _rows_chain_emit(g: fx.Graph, x, parts, _static, b):
    return g.call_function(torch.ops.fuelpipe_kernels.f32_rows_chain_linear.default, (x, list(parts), b))


def _gemm_emit(g: fx.Graph, x, w, _static, b):
    y = g.call_function(torch.matmul, (x, w))
    return y if b is None else g.call_function(operator.add, (y, b))


FORMS: dict[str, LinearForm] = {
    # the traced call as it is: nothing to emit (a lazy fused group's weight is made after the passes)
    "linear": LinearForm("linear", lambda lin, rows, threads: True, weight_of, lambda x, w, b: F.linear(x, w, b),
                         copies=is_lazy),
    "split_gemv": LinearForm(
        "split_gemv", lambda lin, rows, threads: (rows == 1 and device_of(lin).type == "cpu"
                                                  and worth_splitting(lin.weight.to("meta"), threads, on_cpu=True)),
        _split_copy, _split_call, _split_emit),
    "gemm_transposed": LinearForm(
        "gemm_transposed", lambda lin, rows, threads: rows > 1 and device_of(lin).type == "cpu",
        lambda lin: derived("transposed", sources_of(lin), lambda: weight_of(lin).t().contiguous()), _gemm_call,
        _gemm_emit),
    "panels": LinearForm("panels", lambda lin, rows, threads: _cpu_f32(lin) and kernels_available() is None,
                         _panels_copy, _panels_call, _panels_emit),
    "rows": LinearForm("rows", lambda lin, rows, threads: _cpu_f32(lin) and kernels_available() is None,
                       _rows_parts, _rows_call, _rows_emit, copies=lambda lin: False),
    "rows_chain": LinearForm("rows_chain", lambda lin, rows, threads: rows > 1 and _cpu_f32(lin)
                             and kernels_available() is None, _rows_parts, _rows_chain_call, _rows_chain_emit,
                             copies=lambda lin: False),
}


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
# A form holding a second copy of a weight must measure at least this much faster than the fastest form
# reading the model's own tensors: a copy doubles that weight's memory for good, so a gain within the
# timing's noise (a few percent here) does not buy it.
COPY_MIN_GAIN = 0.10


def shape_class(lin: nn.Linear) -> tuple:
    return (lin.out_features, lin.in_features, lin.bias is not None, lin.weight.dtype, device_of(lin).type)


def choose_forms(lins: list[nn.Linear], rows: int, timer: Timer = time_form,
                 candidates: tuple[str, ...] = tuple(FORMS), allow_copies: bool = False) -> dict[tuple, str]:
    """shape class -> the fastest usable form's name for ``lins`` at ``rows`` rows on this CPU (cached).

    ``allow_copies``: forms holding a copy of the weight compete too (chosen only when they measure
    ``COPY_MIN_GAIN`` faster); otherwise only forms reading the model's own tensors do, and a linear no
    such form can run (a fused group where the kernels cannot be built) falls back to ``F.linear``."""
    threads = torch.get_num_threads()
    groups: dict[tuple, list[nn.Linear]] = {}
    for lin in lins:
        groups.setdefault(shape_class(lin), []).append(lin)
    chosen = {}
    for shape, group in groups.items():
        lin = group[0]
        small = lin.weight.numel() < MEASURE_MIN_ELEMENTS
        usable = ("linear",) if small else tuple(n for n in candidates if FORMS[n].usable(lin, rows, threads)
                                                 and (allow_copies or not FORMS[n].copies(lin)))
        usable = usable or ("linear",)
        copying = tuple(n for n in usable if FORMS[n].copies(lin))
        key = (shape, is_lazy(lin), rows, threads, usable, copying, timer)
        if key not in _CHOICES:
            if len(usable) == 1:
                _CHOICES[key] = usable[0]
            else:
                times = {n: timer(FORMS[n], group, rows) for n in usable}
                _CHOICES[key] = pick(times, copying)
        chosen[shape] = _CHOICES[key]
    return chosen


def pick(times: dict[str, float], copying: tuple[str, ...]) -> str:
    """The form to run, from measured ``times``: the fastest reading the model's own weights, unless a
    form holding a copy is at least ``COPY_MIN_GAIN`` faster than it (then the fastest such)."""
    own = [n for n in times if n not in copying]
    best = min(times, key=times.__getitem__)
    if not own or best in own:
        return best
    best_own = min(own, key=times.__getitem__)
    return best if times[best] <= (1.0 - COPY_MIN_GAIN) * times[best_own] else best_own


def forget_choices() -> None:
    """Measure afresh at the next build (tests; a process whose CPU share changed)."""
    _CHOICES.clear()


def measured_linears(gm: fx.GraphModule, rows: int = 1, timer: Timer = time_form, allow_copies: bool = False,
                     sequences: Optional[int] = None) -> int:
    """Run each linear of ``gm`` in the form measured fastest here, at ``rows`` rows, among the forms that read
    the model's own weights (and, with ``allow_copies``, those holding a copy that pays). Returns linears rewritten.

    ``sequences``: the rows a linear after the last-position selection sees (the head: one per sequence,
    where the step's other linears see one per token; a prompt program's 1). None: ``rows``."""
    after_last = _after_last_positions(gm)
    mine = {True: [], False: []}
    for node in gm.graph.nodes:
        lin = linear_of(gm, node)
        if lin is not None:
            mine[node in after_last].append(lin)
    if not mine[True] and not mine[False]:
        return 0
    head_rows = rows if sequences is None else sequences
    chosen = {flag: choose_forms(lins, head_rows if flag else rows, timer, allow_copies=allow_copies)
              for flag, lins in mine.items() if lins}
    by_module = {id(lin): chosen[flag][shape_class(lin)] for flag, lins in mine.items() for lin in lins}
    return rewrite_all(gm, lambda lin: FORMS[by_module[id(lin)]])


def _after_last_positions(gm: fx.GraphModule) -> set:
    """The nodes computed from a ``last_positions`` selection (``fuelpipe.step``): they see sequences, not tokens."""
    from fuelpipe.step import last_positions

    seen: set = set()
    todo = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is last_positions]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


def measured_linears_allowing_copies(gm: fx.GraphModule, rows: int = 1, timer: Timer = time_form,
                                     sequences: Optional[int] = None) -> int:
    """``measured_linears`` where forms holding a copy of a weight (panels, split, transposed) compete too."""
    return measured_linears(gm, rows, timer, allow_copies=True, sequences=sequences)
