"""ms of one token's a16 linears (SmolLM2-135M, 30 distinct layers, no head) on each vector path, interleaved.

    python experiments/vector_paths_cpu/kernel_paths.py THREADS
"""
import time, torch, statistics, sys
from fuelpipe.kernels.build import load, vector_paths, forced_vector_path
from fuelpipe.quant.formats import QuantKind, quantize
load()
ops = torch.ops.fuelpipe_kernels
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[1]))
for kind in (QuantKind.int8, QuantKind.int4):
    layers = [[quantize(torch.randn(n, k), kind, 32) for n, k in shapes] for _ in range(30)]
    xs = [torch.randn(1, k) for n, k in shapes]
    def token():
        for ws in layers:
            for p, x in zip(ws, xs):
                if kind is QuantKind.int8: ops.q8_gemv_a16(x, p.q, p.scales, None)
                else: ops.q4_gemv_a16(x, p.q, p.scales, p.mins, None)
    res = {p: [] for p in vector_paths()[1:]}
    for rep in range(7):
        for path in res:
            with forced_vector_path(path):
                token()
                t = time.perf_counter(); token(); token()
                res[path].append((time.perf_counter() - t) * 500)
    print(f"threads={sys.argv[1]} {kind.value}: " + ", ".join(f"{p} {statistics.median(v):.2f} ms" for p, v in res.items()))
