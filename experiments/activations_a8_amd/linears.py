"""ms of one token's low-bit linears (SmolLM2-135M's four layer shapes, 30 layers, no head), 16- against
8-bit activations, interleaved in one process: weights streamed from DRAM (30 distinct layers) and held in
cache (one layer's matrices 30 times), at 1 and 2 threads. The minimum of 7 repetitions of one token each.

    python experiments/activations_a8_amd/linears.py
"""
import time

import torch

from fuelpipe.kernels.build import load
from fuelpipe.quant.formats import QuantKind, quantize

load()
ops = torch.ops.fuelpipe_kernels
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q/k/v fused, o, gate/up fused, down
FORMS = {"a16": (ops.q8_gemv_a16, ops.q4_gemv_a16), "a8": (ops.q8_gemv_a8, ops.q4_gemv_a8)}
torch.manual_seed(0)
for kind in (QuantKind.int8, QuantKind.int4):
    one = [quantize(torch.randn(n, k), kind, 32) for n, k in SHAPES]
    many = [[quantize(torch.randn(n, k), kind, 32) for n, k in SHAPES] for _ in range(30)]
    xs = [torch.randn(1, k) for _, k in SHAPES]

    def token(fns, layers):
        for ws in layers:
            for p, x in zip(ws, xs):
                if kind is QuantKind.int8:
                    fns[0](x, p.q, p.scales, None)
                else:
                    fns[1](x, p.q, p.scales, p.mins, None)

    for threads in (1, 2):
        torch.set_num_threads(threads)
        for where, layers in (("dram", many), ("cached", [one] * 30)):
            ms = {form: [] for form in FORMS}
            for _ in range(7):
                for form, fns in FORMS.items():
                    token(fns, layers)
                    t0 = time.perf_counter()
                    token(fns, layers)
                    ms[form].append((time.perf_counter() - t0) * 1e3)
            a16, a8 = min(ms["a16"]), min(ms["a8"])
            print(f"{kind.value} threads={threads} {where}: a16 {a16:.2f} ms, a8 {a8:.2f} ms, a16/a8 {a16 / a8:.2f}")
