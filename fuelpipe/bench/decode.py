"""Decode ms/token for the configured plan mode and its counterpart, measured in one process.

Both arms (replan, plan_once) run on the same model, each with its own
context and cache, interleaved token by token (the order alternates every
step) so drift in clock speed or cache state hits both alike. The first
``warmup`` decode tokens are not measured: plan_once builds its plan there,
and that build time is reported on its own (``plan_build_ms``). Memory
bandwidth is estimated as (weight bytes + KV bytes) read per token, the
gpt-fast convention for decode.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import psutil
import torch

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.context import InferenceContext
from fuelpipe.modes import PlanMode
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.oracles.base import Setup
from fuelpipe.plan.backends import BACKENDS
from fuelpipe.sampling import greedy

MB = 1024 * 1024


@dataclass
class Arm:
    mode: PlanMode
    ctx: InferenceContext
    cache: ContiguousKvCache
    token: int
    prefill_ms: float
    decode_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        stats = self.ctx.plan.stats
        return {
            "median_ms": statistics.median(self.decode_ms),
            "p90_ms": percentile(self.decode_ms, 90),
            "prefill_ms": self.prefill_ms,
            "plan_build_ms": 1000.0 * stats.build_s / max(1, stats.builds),
            "plan_builds": stats.builds,
            "plan_cache_hits": stats.cache_hits,
            "plan_cache_misses": stats.cache_misses,
            "plan_compile_ms": 1000.0 * stats.compile_s,
            "plan_cache_load_ms": 1000.0 * stats.cache_load_s,
            "plan_cache_statuses": dict(stats.cache_statuses),
            "plan_cache_detail": stats.cache_detail,
        }


def unused_plan_cache(backend: str) -> str:
    return f"backend={backend} compiles nothing to store; only backend=inductor and backend=aot use backend.plan_cache"


def _plan_cache_record(setup: Setup, summary: dict) -> Optional[dict]:
    """Where the measured mode's build time went with a persistent plan cache (None: no cache in use)."""
    pc = setup.backend.plan_cache
    if not pc.enabled:
        return None
    if not BACKENDS.get(setup.backend.name).stores_plans:
        return {"dir": pc.dir, "unused": unused_plan_cache(setup.backend.name)}
    return {"dir": pc.dir, "hits": summary["plan_cache_hits"], "misses": summary["plan_cache_misses"],
            "statuses": summary["plan_cache_statuses"], "detail": summary["plan_cache_detail"],
            "compile_ms": summary["plan_compile_ms"], "load_ms": summary["plan_cache_load_ms"]}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return ordered[int(rank) - 1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _start(model: DecodeBackbone, setup: Setup, mode: PlanMode, prompt, max_seq_len: int) -> Arm:
    ctx = setup.context(model, plan=mode)
    cache = setup.kv.new_cache(ctx, max_seq_len)
    _sync(ctx.device)
    t0 = time.perf_counter()
    logits = ctx.prefill(cache, list(prompt))
    _sync(ctx.device)
    return Arm(mode, ctx, cache, greedy(logits), 1000.0 * (time.perf_counter() - t0))


def run_decode_bench(
    model: DecodeBackbone,
    setup: Setup,
    prompt,
    *,
    warmup: int,
    tokens: int,
    max_seq_len: int,
    compare_plans: bool,
    on_step: Optional[Callable[[], None]] = None,
) -> dict:
    other = PlanMode.replan if setup.plan is PlanMode.plan_once else PlanMode.plan_once
    arms = [_start(model, setup, setup.plan, prompt, max_seq_len)]
    if compare_plans:
        arms.append(_start(model, setup, other, prompt, max_seq_len))
    proc = psutil.Process()
    peak_rss = proc.memory_info().rss
    device = arms[0].ctx.device
    for step in range(warmup + tokens):
        for arm in arms if step % 2 == 0 else reversed(arms):
            t0 = time.perf_counter()
            logits = arm.ctx.decode(arm.cache, arm.token)
            _sync(device)
            dt = 1000.0 * (time.perf_counter() - t0)
            arm.token = greedy(logits)
            if step >= warmup:
                arm.decode_ms.append(dt)
        peak_rss = max(peak_rss, proc.memory_info().rss)
        if on_step is not None:
            on_step()
    main = arms[0]
    by_mode = {arm.mode.value: arm.summary() for arm in arms}
    ms = by_mode[setup.plan.value]["median_ms"]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = main.cache.nbytes()
    kv_per_token = main.cache.bytes_per_token()
    # MLA: what an equivalent expanded K/V cache would store, for the memory ratio in the report.
    expanded = getattr(model, "expanded_kv_bytes_per_token", None)
    elem = torch.empty((), dtype=main.cache.dtype).element_size()
    expanded_per_token = expanded(elem) if expanded else None
    ratio = None
    if compare_plans:
        ratio = by_mode[PlanMode.replan.value]["median_ms"] / by_mode[PlanMode.plan_once.value]["median_ms"]
    return {
        "plan_mode": setup.plan.value,
        "backend": setup.backend.name,
        "cache_policy": setup.backend.cache_policy,
        "decode_ms_per_token": ms,
        "decode_ms_p90": by_mode[setup.plan.value]["p90_ms"],
        "prefill_ms": main.prefill_ms,
        "plan_build_ms": by_mode[setup.plan.value]["plan_build_ms"],
        "plan_builds": by_mode[setup.plan.value]["plan_builds"],
        "plan_cache": _plan_cache_record(setup, by_mode[setup.plan.value]),
        "tokens": tokens,
        "warmup": warmup,
        "prompt_tokens": len(prompt),
        "tokens_per_s": 1000.0 / ms,
        "peak_rss_mb": peak_rss / MB,
        "peak_device_mb": torch.cuda.max_memory_allocated(device) / MB if device.type == "cuda" else None,
        "kv_layout": setup.kv.layout,
        "kv_bytes": kv_bytes,
        "kv_bytes_per_token": kv_per_token,
        "expanded_kv_bytes_per_token": expanded_per_token,
        "expanded_over_kv": expanded_per_token / kv_per_token if expanded_per_token else None,
        "weight_bytes": weight_bytes,
        "bandwidth_gb_s": (weight_bytes + kv_bytes) / (ms / 1000.0) / 1e9,
        "plan_once_ms_per_token": by_mode.get(PlanMode.plan_once.value, {}).get("median_ms"),
        "replan_ms_per_token": by_mode.get(PlanMode.replan.value, {}).get("median_ms"),
        "replan_over_plan_once": ratio,
        "arms": by_mode,
    }

