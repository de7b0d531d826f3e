"""ms of one batch step's f32 linears (SmolLM2-135M shapes: 30 distinct layers, then the 49152-row head) at
ROWS rows of x, on each vector path of the f32 rows kernel (avx2: 8 lanes per register; avx512: two rows of x
per register, the same bits), interleaved in one process.

    python experiments/decode_overheads_cpu/batch_linears.py THREADS ROWS [ROUNDS]
"""
import statistics
import sys
import time

import torch

from fuelpipe.kernels.build import forced_vector_path, load, vector_paths

load()
ops = torch.ops.fuelpipe_kernels
threads, rows = int(sys.argv[1]), int(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
torch.manual_seed(0)
torch.set_num_threads(threads)
groups = [[(576, 576), (192, 576), (192, 576)], [(576, 576)], [(1536, 576), (1536, 576)], [(576, 1536)]]
layers = [[[torch.randn(n, k) for n, k in g] for g in groups] for _ in range(30)]
head = torch.randn(49152, 576)
xs = {576: torch.randn(rows, 576), 1536: torch.randn(rows, 1536)}


def step():
    out = []
    for gs in layers:
        for g in gs:
            out.append(ops.f32_rows_linear(xs[g[0].shape[1]], g, None))
    out.append(ops.f32_rows_linear(xs[576], [head], None))
    return out


paths = [p for p in ("avx2", "avx512") if p in vector_paths()]
results = {}
for p in paths:
    with forced_vector_path(p):
        results[p] = step()
assert all(all(torch.equal(a, b) for a, b in zip(results[paths[0]], results[p])) for p in paths)  # the same bits
res = {p: [] for p in paths}
for _ in range(rounds):
    for p in paths:
        with forced_vector_path(p):
            step()
            t = time.perf_counter(); step(); res[p].append((time.perf_counter() - t) * 1000)
flops = 2 * rows * (sum(n * k for g in groups for n, k in g) * 30 + 49152 * 576)
base = statistics.median(res["avx2"])
for p, v in res.items():
    med = statistics.median(v)
    print(f"threads={threads} rows={rows} {p:6s}: {med:6.2f} ms (min {min(v):6.2f}), {flops / med / 1e6:5.1f} GFLOP/s, "
          f"avx2 / this {base / med:.2f}x; bits equal across paths")
