"""pytest-benchmark: one decode step per backend x plan mode, on tiny models of every KV path.

No speed assertions: compare the rows of one run (``--benchmark-group-by=group``)
or save JSON (``--benchmark-json``) to track regressions. Each row's
``extra_info`` names its model, path, backend and plan, and counts the plan
builds so a row that silently rebuilt (or never built) is visible in the JSON.

Rounds: ``FUELPIPE_BENCH_SHORT=1`` (CI's benchmark step) takes the short
counts. The SmolLM2-shaped rows are ``slow`` (a cold inductor replan of 30
layers costs minutes per token).
"""
import os

import pytest
import torch

from fuelpipe.context import InferenceContext
from models.registry import build_random_model

PROMPT = list(range(1, 17))
SHORT = os.environ.get("FUELPIPE_BENCH_SHORT") == "1"
# (plan_once rounds, replan rounds) per backend; replan on inductor compiles every round.
ROUNDS = {
    "tiny": {"eager": (20, 10), "fx": (20, 10), "inductor": (20, 3)},
    "smollm2_135m": {"eager": (10, 5), "fx": (10, 3), "inductor": (10, 2)},
}
SHORT_ROUNDS = {"eager": (5, 3), "fx": (5, 2), "inductor": (5, 1)}

# Tiny models per KV path: (family, KV kind, offset path; None: the family's own).
# llama_tensor vs llama_symbol compares the two offset paths on one model.
TINY_PATHS = {
    "llama_tensor": ("llama", "contiguous", None),  # device-offset path, attends the padded cache
    "llama_symbol": ("llama", "contiguous", "symbol"),  # symbol path, attends the live prefix
    "llama_paged": ("llama", "paged", None),  # block pool + block table
    "phi_symbol": ("phi", "contiguous", None),  # Phi's own path is the symbol path
    "deepseek_latent": ("deepseek_v2", "latent", None),  # MLA latent slots
}

_models: dict[tuple[str, str], torch.nn.Module] = {}


def model_for(family, size):
    if (family, size) not in _models:
        _models[family, size] = build_random_model(family, size, seed=0)
    return _models[family, size]


def rounds_for(size, backend, plan):
    table = SHORT_ROUNDS if SHORT else ROUNDS[size]
    once, replan = table[backend]
    return once if plan == "plan_once" else replan


def new_cache(ctx, kv):
    if kv == "paged":
        return ctx.new_pool(num_blocks=9, block_size=16).sequence(8)
    return ctx.new_cache(128)  # contiguous, or a latent cache for an MLA model


def bench_decode(benchmark, family, size, backend, plan, kv="contiguous", offset_mode=None):
    ctx = InferenceContext(model_for(family, size), backend, plan, offset_mode=offset_mode)
    cache = new_cache(ctx, kv)
    ctx.prefill(cache, PROMPT)
    ctx.decode(cache, 5)  # the build token (plan_once) is not what we time

    def one_token():
        if cache.cached_len >= cache.max_seq_len - 1:
            cache.truncate_to(len(PROMPT))
        ctx.decode(cache, 7)

    benchmark.extra_info.update(
        {"family": family, "model": size, "backend": backend, "plan": plan, "kv": kv,
         "offset_mode": ctx.offset_mode, "builds_before": ctx.plan.stats.builds}
    )
    benchmark.pedantic(one_token, rounds=rounds_for(size, backend, plan), warmup_rounds=1 if plan == "plan_once" else 0)
    builds = ctx.plan.stats.builds
    benchmark.extra_info["builds"] = builds
    # The benchmark measures what it claims: plan_once reused its one plan, replan built every round.
    if plan == "plan_once":
        assert builds == 1, f"plan_once rebuilt during the benchmark ({builds} builds)"
    else:
        assert builds > 1, "replan never rebuilt"


@pytest.mark.bench
@pytest.mark.parametrize("plan", ["plan_once", "replan"])
@pytest.mark.parametrize("backend", ["eager", "fx", "inductor"])
@pytest.mark.parametrize("path", list(TINY_PATHS))
def test_decode_tiny(benchmark, path, backend, plan):
    family, kv, offset_mode = TINY_PATHS[path]
    benchmark.group = f"decode tiny {path}"
    bench_decode(benchmark, family, "tiny", backend, plan, kv, offset_mode)


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.parametrize("plan", ["plan_once", "replan"])
@pytest.mark.parametrize("backend", ["eager", "fx", "inductor"])
def test_decode_smollm2_shaped(benchmark, backend, plan):
    benchmark.group = "decode smollm2_135m-shaped llama"
    bench_decode(benchmark, "llama", "smollm2_135m", backend, plan)
