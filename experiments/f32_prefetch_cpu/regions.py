"""Per decode token of SmolLM2-135M (aot, f32, plan_once): OpenMP parallel regions (fork/joins), the cost
of an empty one, and the share of the step inside the f32 linears.

    python experiments/f32_prefetch_cpu/regions.py THREADS

It compiles ``omp_count.c`` (a counter in front of libgomp's ``GOMP_parallel``) with the system's C
compiler and runs itself again with it preloaded. The share inside the linears comes from
torch.profiler over 32 steps (each event's own time; the profiler's bookkeeping makes the rest an upper
bound).
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
    from torch.profiler import ProfilerActivity, profile

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

    cache = ctx.new_cache(len(prompt) + 40)
    token = greedy(ctx.prefill(cache, prompt))
    for _ in range(4):  # the held plan rebound to this cache, warm
        token = greedy(ctx.decode(cache, token))
    steps = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(32):
            t = time.perf_counter()
            token = greedy(ctx.decode(cache, token))
            steps.append((time.perf_counter() - t) * 1e3)
    linear = [e for e in prof.events() if e.name == "fuelpipe_kernels::f32_rows_linear"]
    per_step_linear = sum(e.self_cpu_time_total for e in linear) / 1e3 / 32
    assert len(linear) == 32 * 121, len(linear)  # 30 layers x (q/k/v, o, gate/up, down) + the head
    print(f"threads={threads}: {per_token:.1f} OpenMP regions per decode token; an empty region {statistics.median(empty):.2f} us "
          f"(so {per_token * statistics.median(empty) / 1e3:.3f} ms of fork/join per token); under the profiler a step "
          f"{statistics.median(steps):.2f} ms, of it {per_step_linear:.2f} ms inside the f32 linears "
          f"({statistics.median(steps) - per_step_linear:.2f} ms outside)")


if __name__ == "__main__":
    preloaded()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
