"""kernel_parity: every C++ operator the engine can use, against its readable reference, at its own tolerance.

The decode oracles compare whole logits at a tolerance sized for the loosest
path (1e-3 of the logit scale with 16-bit activations), on tiny models whose
shapes never reach a kernel's edges. This oracle calls each operator of
``torch.ops.fuelpipe_kernels`` directly on a grid of edge shapes and compares
every output element with the readable statement of what it computes:

* ``q8_gemv`` / ``q4_gemv`` / ``bf16_gemv``: ``F.linear(x, formats.dequantize(w), bias)``;
* ``q8_gemv_a16`` / ``q4_gemv_a16``: ``F.linear(formats.round_trip_activations(x), formats.dequantize(w), bias)``;
* ``q8_gemv_a8`` / ``q4_gemv_a8``: the same with ``round_trip_activations(x, bits=8)``;
* ``f32_rows_linear`` / ``f32_rows_chain_linear`` / ``f32_panel_linear``: ``F.linear(x, w, bias)``
  (a fused list of parts is their concatenation; panels are ``plan.panels.pack_panels``);
* ``slot_attention``: ``fuelpipe.kv.slot_attention.slot_attention`` (the readable form).

The references run in float64 on the same f32 inputs, so their own error is
negligible; each output's bound comes from the kernel's arithmetic (u = 2^-24,
the f32 unit roundoff; first order in u):

* f32 activations, f32 accumulation in any order, any vector path (the scalar
  path is one sequential chain over k): ``(K + 8) u (|x| @ |w|^T + |bias|)``, where
  ``|w|`` of a low-bit weight is ``|code * scale| + |min|`` (its terms as summed).
* 16-bit activations: the kernel and the reference share the integer part (the
  same f32 step ``max|x| / 32767`` and the same half-even codes), and a block's
  products sum exactly in int32, so only the per-block scaling and the sum over
  blocks round: ``(K / 32 + 8) u (|x_hat| @ |w|^T + |bias|)``, x_hat the round-tripped
  activations. Probe weights (one nonzero code per row) make each output one
  activation code times one weight, so a code off by one anywhere moves that
  output by at least 1/32767 of it, against a bound of about 10 u (~6e-7).
* 8-bit activations: the same bound and the same argument, at steps ``max|x| / 127``.
* slot attention: a score's error is at most ``E = (D + 2) u scale sum|q k| + u |s|``;
  through the softmax and the weighted sum over the n attended slots the
  output's error is at most ``(4 E + (2 n + 8) u) max_j |v_j|``.

The grid is built for the classes of bug, not for one: block counts odd and
even (K = 32, 96, 160 and the model's own in_features and one block either
side), output counts off every unroll (1, 3, 17, ...), one and several rows,
group sizes 32 and 64, f16 and f32 scales, with and without bias; for the
16-bit path, activation blocks with a single spike, exact ties at half a code,
all zeros, and a negative maximum; slot attention with rows filled to their
capacity, rows with one live slot, several slots, grouped KV heads, T = 1 and
T > 1, and NaN in every slot no query may attend. Inputs come from a seeded
generator. Every case runs on every vector path the CPU has that the kernel has
(``PATHS_OF_KERNEL``; scalar always), each path forced in turn. The metric
reports the cases run, the worst error/bound ratio per kernel over all paths and
per path (passing needs every ratio <= 1), the paths run, and the path decode
takes.

Negative control (``Fault.KERNEL_TAIL_DROPPED``): each kernel is fed its input
without its tail, the linear kernels' activations with the last 32-element
block zeroed and slot attention's mask hiding each row's last slot; it must fail.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult, skipped
from fuelpipe.oracles.kernel_parity_slots import slot_cases
from fuelpipe.plan.panels import pack_panels
from fuelpipe.quant import formats
from fuelpipe.quant.formats import BLOCK, PackedWeight, QuantKind
from fuelpipe.quant.modules import OP_SUFFIX

NAME = "kernel_parity"
U = 2.0 ** -24  # f32 unit roundoff
SEED = 34
BASE_K = (32, 96, 160)  # 1, 3 and 5 blocks: odd block counts, which no tiny model has
WIDE_K = (64, 192)  # group size 64 needs K a multiple of 64: 1 and 3 groups
F32_K = (1, 7, 9, 33)  # below and across every 8- and 16-wide vector step
# (rows M, outputs N, bias): decode (the fused M == 1 paths), a batch, and more rows than one tile holds, times
# output counts off every unroll and parallel grain; each with and without a bias somewhere.
SHAPES = ((1, 1, False), (1, 17, True), (3, 3, True), (3, 17, False))
F32_SHAPES = SHAPES + ((7, 17, True), (8, 17, False))  # M = 8: the avx512 f32 tile's four row pairs
TIE_STEP = 2.0 ** -10  # ties block: max|x| = 32767 * 2^-10, so the step is exactly 2^-10
BLOCK_KINDS = ("normal", "spike", "ties", "zero", "negative_max")
# The vector paths each kernel has (fuelpipe/kernels/vector_path.h); every one the CPU runs is checked.
_A16_PATHS = ("scalar", "avx2", "avx_vnni", "avx512")
_BASE_PATHS = ("scalar", "avx2")
_F32_ROWS_PATHS = ("scalar", "avx2", "avx512")  # avx512: two rows of x per register (several rows only)
PATHS_OF_KERNEL = {"q8_gemv": _BASE_PATHS, "q4_gemv": _BASE_PATHS, "q8_gemv_a16": _A16_PATHS, "q4_gemv_a16": _A16_PATHS,
                   "q8_gemv_a8": _BASE_PATHS, "q4_gemv_a8": _BASE_PATHS,
                   "bf16_gemv": _BASE_PATHS, "f32_panel_linear": _BASE_PATHS, "f32_rows_linear": _F32_ROWS_PATHS,
                   "f32_rows_chain_linear": _BASE_PATHS, "slot_attention": _BASE_PATHS}


@dataclass
class _Tally:
    """Per kernel: cases run and the worst error/bound ratio; the first failing case of each kernel.

    ``check`` records a kernel's output and how to compute its reference; ``settle`` computes the references
    afterwards on one thread (after each vector path's pass): the kernels run at the run's thread count, while float64 references of tiny
    shapes only lose time to a thread pool (measured: 0.7 s on one thread against 5 s on two busy cores)."""

    cases: dict[str, int] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    pending: list = field(default_factory=list)

    def check(self, kernel: str, label: str, got: torch.Tensor, reference: Callable[..., tuple], *args) -> None:
        """``reference(*args)`` -> (want, bound), both float64 shaped like ``got``."""
        self.pending.append((kernel, label, got, reference, args))

    def settle(self) -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for kernel, label, got, reference, args in self.pending:
                self._compare(kernel, label, got, *reference(*args))
        finally:
            torch.set_num_threads(before)
        self.pending.clear()

    def _compare(self, kernel: str, label: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
        err = (got.double() - want).abs()
        # NaN anywhere (got or want) is an infinite ratio; a zero bound allows only an exact match.
        ratio = torch.where(err > 0, err / bound.clamp_min(1e-300), torch.zeros_like(err))
        ratio = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), ratio)
        worst = float(ratio.max()) if ratio.numel() else 0.0
        self.cases[kernel] = self.cases.get(kernel, 0) + 1
        self.worst[kernel] = max(self.worst.get(kernel, 0.0), worst)
        if worst > 1.0 and kernel not in self.failures:
            i = int(ratio.flatten().argmax())
            self.failures[kernel] = (f"{kernel} {label}: error {float(err.flatten()[i]):.3g} at flat index {i} "
                                     f"is {worst:.3g}x its bound {float(bound.flatten()[i]):.3g}")


def _linear_reference(x: torch.Tensor, w: torch.Tensor, w_abs: torch.Tensor, bias: Optional[torch.Tensor],
                      chain: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.linear in float64, its bound ``(chain + 8) u (|x| @ |w|^T + |bias|)``: f32 accumulation with
    ``chain`` roundings in a row, in any order)."""
    b64 = None if bias is None else bias.double()
    mag = F.linear(x.double().abs(), w_abs, None if b64 is None else b64.abs())
    return F.linear(x.double(), w.double(), b64), (chain + 8) * U * mag


def _quant_reference(x: torch.Tensor, p: PackedWeight, w_abs: torch.Tensor, bias: Optional[torch.Tensor],
                     bits: Optional[int]):
    """The readable low-bit product: dequantized weights, and round-tripped activations on the 16- / 8-bit paths."""
    if bits:
        return _linear_reference(formats.round_trip_activations(x, bits), formats.dequantize(p), w_abs, bias,
                                 x.shape[-1] // BLOCK)
    return _linear_reference(x, formats.dequantize(p), w_abs, bias, x.shape[-1])


def _dropped_tail(x: torch.Tensor) -> torch.Tensor:
    """The negative control's input: the activations without their last 32-element block (zeroed)."""
    out = x.clone()
    out[..., -min(BLOCK, x.shape[-1]):] = 0.0
    return out


class _Grid:
    """Seeded inputs, the fault, and the tally shared by every kernel's cases."""

    def __init__(self, fault: Fault, kernels: frozenset[str] = frozenset()) -> None:
        self.kernels = kernels  # the kernels this pass runs (each vector path runs the kernels that have it)
        self.gen = torch.Generator().manual_seed(SEED)
        self.feed: Callable[[torch.Tensor], torch.Tensor] = (
            _dropped_tail if fault is Fault.KERNEL_TAIL_DROPPED else (lambda x: x))
        self.hide_last_slot = fault is Fault.KERNEL_TAIL_DROPPED
        self.tally = _Tally()

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def randint(self, lo: int, hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=self.gen)

    def bias(self, n: int, with_bias: bool) -> Optional[torch.Tensor]:
        return self.randn(n) if with_bias else None

    # ---- activations ----------------------------------------------------------------------------

    def block(self, kind: str, levels: int = 32767) -> torch.Tensor:
        """One 32-element activation block of the given kind (see ``BLOCK_KINDS``), for codes of ``levels``."""
        at = int(self.randint(0, BLOCK, 1))
        if kind == "zero":
            return torch.zeros(BLOCK)
        if kind == "ties":  # every element but the maximum sits exactly half-way between two codes
            codes = self.randint(-(levels * 6) // 10, (levels * 6) // 10, BLOCK).double()
            x = ((codes + 0.5) * TIE_STEP).float()
            x[at] = (1.0 if at % 2 else -1.0) * levels * TIE_STEP
            return x
        if kind == "spike":  # one large element; the rest far below it
            x = 1e-3 * self.randn(BLOCK)
            x[at] = 3.0 if at % 2 else -3.0
            return x
        x = self.randn(BLOCK) * float(10.0 ** (self.randint(-2, 3, 1)))
        if kind == "negative_max":  # the block's largest magnitude is a negative element; positives stay below it
            top = float(x.abs().max()) * 1.25
            x = x.clamp(-top * 0.7, top * 0.7)
            x[at] = -top
        return x

    def activations(self, m: int, k: int, levels: int = 32767) -> torch.Tensor:
        """[m, k]: row r's block b of kind ``BLOCK_KINDS[(b + r) % 5]``, so every kind lands on every block
        position (the last one included) across the rows; a row of fewer than 5 blocks still sees several kinds."""
        rows = [torch.cat([self.block(BLOCK_KINDS[(b + r) % len(BLOCK_KINDS)], levels) for b in range(k // BLOCK)])
                for r in range(m)]
        return torch.stack(rows)

    # ---- low-bit weights, built from codes (not quantized from floats: every code value is reachable) ----

    def packed(self, kind: QuantKind, n: int, k: int, g: int, sdtype: torch.dtype, probe: bool = False):
        """(PackedWeight, |w| [n, k] f64 as the kernel sums it). ``probe``: row i has one nonzero code, at
        column ``probe_columns(k)[i]`` (n must be their count)."""
        scales = (0.001 + 0.02 * torch.rand(n, k // g, generator=self.gen)).to(sdtype)
        s = scales.double().repeat_interleave(g, dim=-1)
        if kind is QuantKind.int8:
            codes = self.randint(-128, 128, n, k)  # -128 too: a GGUF Q8_0 block may hold it
            if probe:
                sign = self.randint(0, 2, n) * 2 - 1
                codes = _one_per_row(sign * self.randint(64, 128, n), k)
            p = PackedWeight(kind, codes.to(torch.int8).contiguous(), scales.contiguous())
            return p, codes.double().abs() * s
        codes = _one_per_row(torch.full((n,), 15), k) if probe else self.randint(0, 16, n, k)
        mins = torch.zeros_like(scales) if probe else (-8 * torch.rand(n, k // g, generator=self.gen) * 0.02).to(sdtype)
        p = PackedWeight(kind, formats.pack_int4(codes), scales.contiguous(), mins.contiguous())
        return p, codes.double() * s + mins.double().abs().repeat_interleave(g, dim=-1)


def probe_columns(k: int) -> list[int]:
    """The columns the probe rows read: every column of the first and last two blocks (where a kernel's
    head and tail handling lives) and a column every 7 in between. Every column of K would make the probe
    K x K: 4.3 M codes at K = 2080, a gigabyte of float64 bounds on a real checkpoint's widths."""
    edge = 2 * BLOCK
    if k <= 2 * edge:
        return list(range(k))
    return [*range(edge), *range(edge, k - edge, 7), *range(k - edge, k)]


def _one_per_row(values: torch.Tensor, k: int) -> torch.Tensor:
    """[n, k] long codes: row i holds ``values[i]`` at ``probe_columns(k)[i]``, zero elsewhere."""
    codes = torch.zeros(len(values), k, dtype=torch.long)
    codes[torch.arange(len(values)), torch.tensor(probe_columns(k))] = values
    return codes


def _quant_call(ops, kind: QuantKind, bits: Optional[int], x: torch.Tensor, p: PackedWeight, bias):
    if kind is QuantKind.int8:
        return getattr(ops, f"q8_gemv{OP_SUFFIX[bits]}")(x, p.q, p.scales, bias)
    return getattr(ops, f"q4_gemv{OP_SUFFIX[bits]}")(x, p.q, p.scales, p.mins, bias)


def _levels(bits: Optional[int]) -> int:
    return formats.activation_levels(bits or 16)


def _quant_cases(grid: _Grid, ops, ks: list[int]) -> None:
    """q8/q4, f32, 16- and 8-bit activations: every K x group x scale dtype x kind, over ``SHAPES``, then a probe
    per integer activation form."""
    for k, g, sdtype, kind in itertools.product(ks, (32, 64), (torch.float16, torch.float32),
                                                (QuantKind.int8, QuantKind.int4)):
        if k % g:
            continue
        op = "q8_gemv" if kind is QuantKind.int8 else "q4_gemv"
        label = f"K={k} G={g} scales={str(sdtype)[6:]}"
        for m, n, with_bias in SHAPES:
            p, w_abs = grid.packed(kind, n, k, g, sdtype)
            bias = grid.bias(n, with_bias)
            for bits in (None, 16, 8):
                if op + OP_SUFFIX[bits] not in grid.kernels:
                    continue
                x = grid.activations(m, k, _levels(bits)) if bits else grid.randn(m, k)
                grid.tally.check(op + OP_SUFFIX[bits], f"{label} N={n} M={m} bias={with_bias}",
                                 _quant_call(ops, kind, bits, grid.feed(x), p, bias),
                                 _quant_reference, x, p, w_abs, bias, bits)
        # Probe: one code per output, so each output is one activation code times one weight.
        for bits in (16, 8):
            if op + OP_SUFFIX[bits] not in grid.kernels:
                continue
            p, w_abs = grid.packed(kind, len(probe_columns(k)), k, g, sdtype, probe=True)
            x = grid.activations(3, k, _levels(bits))
            grid.tally.check(op + OP_SUFFIX[bits], f"probe {label}", _quant_call(ops, kind, bits, grid.feed(x), p, None),
                             _quant_reference, x, p, w_abs, None, bits)


def _f32_cases(grid: _Grid, ops, ks: list[int]) -> None:
    """bf16 weights, row-major f32 (one part, fused parts, a column block of a wider matrix) and panels; each
    kernel only on the paths it has (``grid.kernels``)."""
    has = grid.kernels & {"bf16_gemv", "f32_panel_linear", "f32_rows_linear", "f32_rows_chain_linear"}
    if not has:
        return
    for k, (m, n, with_bias) in itertools.product(ks, F32_SHAPES):
        label = f"K={k} N={n} M={m} bias={with_bias}"
        x = grid.randn(m, k)
        bias = grid.bias(n, with_bias)
        w = grid.randn(n, k).to(torch.bfloat16)
        if "bf16_gemv" in has:
            grid.tally.check("bf16_gemv", label, ops.bf16_gemv(grid.feed(x), w, bias),
                             _linear_reference, x, w, w.double().abs(), bias, k)
        w = grid.randn(n, k)
        if "f32_panel_linear" in has:
            grid.tally.check("f32_panel_linear", label, ops.f32_panel_linear(grid.feed(x), pack_panels(w), n, bias),
                             _linear_reference, x, w, w.double().abs(), bias, k)
        wide = grid.randn(n + 5, k + 3)  # parts: [n, k] block of a wider matrix, then two fused siblings
        parts = [wide[:n, :k], grid.randn(3, k), grid.randn(2, k)]
        whole = torch.cat(parts)
        fused_bias = grid.bias(n + 5, with_bias)
        for op in ("f32_rows_linear", "f32_rows_chain_linear"):
            if op in has:
                grid.tally.check(op, label, getattr(ops, op)(grid.feed(x), parts, fused_bias),
                                 _linear_reference, x, whole, whole.double().abs(), fused_bias, k)


def _model_in_features(model) -> set[int]:
    return {int(m.in_features) for m in model.modules() if isinstance(getattr(m, "in_features", None), int)}


def run(inp: OracleInput) -> OracleResult:
    from fuelpipe.kernels.build import (
        KernelBuildError, forced_vector_path, kernel_paths, load, vector_path, vector_paths,
    )

    try:
        load()
    except KernelBuildError as err:
        return skipped(NAME, f"the kernels could not be built here: {err}")
    ops = torch.ops.fuelpipe_kernels
    own = _model_in_features(inp.model)
    quant_k = sorted(set(BASE_K) | set(WIDE_K) | {k + dk for k in own if k % BLOCK == 0 for dk in (-BLOCK, 0, BLOCK)
                                                   if k + dk > 0})
    f32_k = sorted(set(F32_K) | set(BASE_K) | {k + dk for k in own for dk in (-1, 0, 1) if k + dk > 0})
    chosen, measured = vector_path(), kernel_paths()
    by_path: dict[str, _Tally] = {}
    with torch.no_grad():
        for path in vector_paths():  # every path this CPU runs, each kernel on the paths it has
            grid = _Grid(inp.fault, frozenset(k for k, paths in PATHS_OF_KERNEL.items() if path in paths))
            with forced_vector_path(path):
                _quant_cases(grid, ops, quant_k)
                _f32_cases(grid, ops, f32_k)
                slot_cases(grid, ops, inp)
            grid.tally.settle()
            by_path[path] = grid.tally
    worst: dict[str, float] = {}
    for tally in by_path.values():
        for kernel, ratio in tally.worst.items():
            worst[kernel] = max(worst.get(kernel, 0.0), ratio)
    failures = [f"[{path}] {text}" for path, tally in by_path.items() for text in tally.failures.values()]
    metric = {"cases": sum(sum(t.cases.values()) for t in by_path.values()), "vector_path": chosen,
              "vector_paths": list(by_path), "kernel_paths": measured,
              "worst_ratio": {k: float(f"{v:.3g}") for k, v in worst.items()},
              "worst_ratio_by_path": {path: {k: float(f"{v:.3g}") for k, v in t.worst.items()}
                                      for path, t in by_path.items()},
              "quant_k": quant_k, "f32_k": f32_k}
    detail = ("error/bound ratio <= 1 per output, bounds derived from each kernel's arithmetic "
              f"(module docstring); {metric['cases']} cases on the paths {', '.join(by_path)} "
              f"(each kernel on the paths it has; decode takes {chosen}, "
              + ", ".join(f"{k} {p}" for k, p in measured.items()) + " as measured)")
    if failures:
        detail = "failed: " + "; ".join(failures) + f"; {detail}"
    return OracleResult(name=NAME, passed=not failures, metric=metric, tolerance=None, detail=detail)
