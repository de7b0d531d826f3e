"""pytest-benchmark: decode ms/token, replan vs plan_once, per backend.

No speed assertions: compare the rows of one run (``--benchmark-group-by=param:model``)
or save JSON (``--benchmark-json``) to track regressions. The SmolLM2-shaped rows are
``slow`` (a cold inductor replan of 30 layers costs minutes per token).
"""
import pytest
import torch

from fuelpipe.context import InferenceContext
from models.registry import build_random_model

PROMPT = list(range(1, 17))
ROUNDS = {"tiny": {"eager": 20, "fx": 20, "inductor": 20}, "smollm2_135m": {"eager": 10, "fx": 10, "inductor": 10}}
REPLAN_ROUNDS = {"tiny": {"eager": 10, "fx": 10, "inductor": 3}, "smollm2_135m": {"eager": 5, "fx": 3, "inductor": 2}}

_models: dict[str, torch.nn.Module] = {}


def model_for(size):
    if size not in _models:
        _models[size] = build_random_model("llama", size, seed=0)
    return _models[size]


def bench_decode(benchmark, size, backend, plan, kv="contiguous"):
    ctx = InferenceContext(model_for(size), backend, plan)
    cache = ctx.new_cache(128) if kv == "contiguous" else ctx.new_pool(num_blocks=9, block_size=16).sequence(8)
    ctx.prefill(cache, PROMPT)
    ctx.decode(cache, 5)  # the build token (plan_once) is not what we time

    def one_token():
        if cache.cached_len >= cache.max_seq_len - 1:
            cache.truncate_to(len(PROMPT))
        ctx.decode(cache, 7)

    rounds = (ROUNDS if plan == "plan_once" else REPLAN_ROUNDS)[size][backend]
    benchmark.group = f"decode {size} {backend}"
    benchmark.extra_info.update(
        {"model": size, "backend": backend, "plan": plan, "kv": kv, "builds_before": ctx.plan.stats.builds}
    )
    benchmark.pedantic(one_token, rounds=rounds, warmup_rounds=1 if plan == "plan_once" else 0)
    benchmark.extra_info["builds"] = ctx.plan.stats.builds


@pytest.mark.bench
@pytest.mark.parametrize("plan", ["plan_once", "replan"])
@pytest.mark.parametrize("backend", ["eager", "fx", "inductor"])
def test_decode_tiny(benchmark, backend, plan):
    bench_decode(benchmark, "tiny", backend, plan)


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.parametrize("plan", ["plan_once", "replan"])
@pytest.mark.parametrize("backend", ["eager", "fx", "inductor"])
def test_decode_smollm2_shaped(benchmark, backend, plan):
    bench_decode(benchmark, "smollm2_135m", backend, plan)


@pytest.mark.bench
@pytest.mark.parametrize("plan", ["plan_once", "replan"])
@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_decode_tiny_paged_vs_contiguous(benchmark, kv, plan):
    """Same model, same backend: paged vs contiguous and plan_once vs replan in one group."""
    bench_decode(benchmark, "tiny", "fx", plan, kv)
    benchmark.group = "decode tiny fx: kv x plan"
