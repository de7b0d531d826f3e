"""ms of one token's f32 linears (SmolLM2-135M shapes: 30 distinct layers, then the 49152-row head) with the f32
rows kernel's software prefetch at each distance, interleaved in one process.

    python experiments/decode_overheads_cpu/linears.py THREADS [ROUNDS [ROWS]]
"""
import statistics
import sys
import time

import torch

from fuelpipe.kernels.build import f32_prefetch_bytes, forced_f32_prefetch, load
from fuelpipe.kernels.path_choice import LAYER, PREFETCH_BYTES

load()
measured = f32_prefetch_bytes()
ops = torch.ops.fuelpipe_kernels
threads, rounds = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 15
torch.manual_seed(0)
torch.set_num_threads(threads)
groups = [[(576, 576), (192, 576), (192, 576)], [(576, 576)], [(1536, 576), (1536, 576)], [(576, 1536)]]
assert [(sum(n for n, _ in g), g[0][1]) for g in groups] == list(LAYER)  # the fused q/k/v and gate/up as planned
layers = [[[torch.randn(n, k) for n, k in g] for g in groups] for _ in range(30)]
head = torch.randn(49152, 576)
ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 1  # rows of x: 1 for single-stream decode, B for a batch step
xs = {576: torch.randn(ROWS, 576), 1536: torch.randn(ROWS, 1536)}


def run_layers():
    for gs in layers:
        for g in gs:
            ops.f32_rows_linear(xs[g[0].shape[1]], g, None)


def run_head():
    ops.f32_rows_linear(xs[576], [head], None)


res = {b: ([], []) for b in PREFETCH_BYTES}
for _ in range(rounds):
    for ahead in PREFETCH_BYTES:
        with forced_f32_prefetch(ahead):
            run_layers(), run_head()
            t0 = time.perf_counter(); run_layers(); t1 = time.perf_counter(); run_head(); t2 = time.perf_counter()
        res[ahead][0].append((t1 - t0) * 1000)
        res[ahead][1].append((t2 - t1) * 1000)
print(f"threads={threads}, rows={ROWS}, {rounds} rounds, measured distance at load: {measured} bytes")
base = statistics.median(res[0][0]) + statistics.median(res[0][1])
for ahead, (lay, hd) in res.items():
    total = statistics.median(lay) + statistics.median(hd)
    print(f"prefetch {ahead:5d} B: layers {statistics.median(lay):6.2f} ms (min {min(lay):6.2f})  head "
          f"{statistics.median(hd):5.2f} ms (min {min(hd):5.2f})  sum {total:6.2f} ms  no prefetch / this {base / total:.3f}")
