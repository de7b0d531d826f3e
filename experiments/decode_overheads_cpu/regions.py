"""Per decode token of SmolLM2-135M (aot, f32, plan_once): OpenMP parallel regions (fork/joins), the cost
of an empty one, and the step split into its f32 linears and the rest.

    python experiments/decode_overheads_cpu/regions.py THREADS

It compiles ``omp_count.c`` (a counter in front of libgomp's ``GOMP_parallel``) with the system's C
compiler and runs itself again with it preloaded. The time inside the linears is the kernel's own clock
(``f32_rows_clock_ns``: wall time inside ``f32_rows_linear``) diffed around 64 timed steps, no profiler.
"""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def preloaded() -> None:
    if os.environ.get("FUELPIPE_OMP_COUNT") == "1":
        return
    lib = Path(tempfile.mkdtemp()) / "libompcount.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(HERE / "omp_count.c"), "-o", str(lib), "-ldl"], check=True)
    env = dict(os.environ, LD_PRELOAD=str(lib), FUELPIPE_OMP_COUNT="1")
    sys.exit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)


def main(threads: int) -> None:
    import torch

    import fuelpipe

    lib = ctypes.CDLL(None)
    lib.fuelpipe_omp_regions.restype = ctypes.c_long
    m = fuelpipe.load("smollm2_135m", backend="aot", threads=threads)
    ctx = m.context
    prompt = [1, 504, 3458, 282, 4649, 314, 253, 1789]

    def regions_for(n: int) -> int:
        before = lib.fuelpipe_omp_regions()
        ctx.generate(prompt, n)
        return lib.fuelpipe_omp_regions() - before

    ctx.generate(prompt, 4)  # the plan is built (or loaded) here
    per_token = (regions_for(65) - regions_for(1)) / 64
    lib.fuelpipe_omp_empty(2000)
    empty = []
    for _ in range(7):
        t = time.perf_counter()
        lib.fuelpipe_omp_empty(20000)
        empty.append((time.perf_counter() - t) / 20000 * 1e6)
    from fuelpipe.sampling import greedy

    cache = ctx.new_cache(len(prompt) + 80)
    token = greedy(ctx.prefill(cache, prompt))
    for _ in range(4):  # the held plan rebound to this cache, warm
        token = greedy(ctx.decode(cache, token))
    clock = torch.ops.fuelpipe_kernels.f32_rows_clock_ns
    steps, inside = [], []
    for _ in range(64):
        c, t = clock(), time.perf_counter()
        token = greedy(ctx.decode(cache, token))
        steps.append((time.perf_counter() - t) * 1e3)
        inside.append((clock() - c) / 1e6)
    step_ms, linear_ms = statistics.median(steps), statistics.median(inside)
    outside = statistics.median([s - i for s, i in zip(steps, inside)])
    print(f"threads={threads}: {per_token:.1f} OpenMP regions per decode token; an empty region {statistics.median(empty):.2f} us "
          f"(so {per_token * statistics.median(empty) / 1e3:.3f} ms of fork/join per token); a step {step_ms:.2f} ms "
          f"(median of 64), {linear_ms:.2f} ms inside the f32 linears, {outside:.2f} ms outside them")


if __name__ == "__main__":
    preloaded()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
