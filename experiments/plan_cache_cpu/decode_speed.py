"""Decode ms/token: the stored AOT plan (backend.plan_cache) vs the torch.compile plan of the same step, interleaved in one process.

    python experiments/plan_cache_cpu/decode_speed.py
"""
import statistics, sys, tempfile, time, torch
torch.set_num_threads(2)
from fuelpipe.context import InferenceContext
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.weights import load_named
model = load_named("smollm2_135m", dtype=torch.float32, device=torch.device("cpu"))[0]
arms = {"torch.compile": BackendSpec(name="inductor"),
        "aot (plan_cache)": BackendSpec(name="inductor", plan_cache=PlanCacheSpec(dir=tempfile.mkdtemp()))}
state = {}
for name, spec in arms.items():
    ctx = InferenceContext(model, spec); cache = ctx.new_cache(256)
    ctx.prefill(cache, [1, 9690, 2, 314, 1782]); ctx.decode(cache, 28)  # build
    state[name] = (ctx, cache, [])
tok = 44
for rep in range(4):
    for name, (ctx, cache, times) in state.items():
        for i in range(12):
            t = time.perf_counter(); ctx.decode(cache, tok); times.append(time.perf_counter() - t)
        cache.truncate_to(6)
for name, (ctx, cache, times) in state.items():
    print(f"{name}: median {1000*statistics.median(times):.1f} ms/token over {len(times)} tokens")
