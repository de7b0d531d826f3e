"""How ``bench_batch`` runs: references, interleaved timed passes, the scaling floor, a continuous-batching run."""
from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from typing import Callable, Optional

import torch

from fuelpipe.bench.batch_systems import BatchSystem, FuelpipeBatch, LlamaCppBatch, TransformersBatch
from fuelpipe.bench.peers.experiment import checkpoint_gguf, peak_rss_mb, peer_versions
from fuelpipe.machine import cpu_name, speed_extensions
from fuelpipe.bench.peers.floor import kv_bytes_read, measure_in_subprocess, weight_bytes_per_token
from fuelpipe.kv.spec import KvSpec
from fuelpipe.results import git_hash


def bench_prompts(c, asm) -> list[list[int]]:
    """One token-id prompt per row: the configured texts (chat-wrapped when asked and possible), or synthetic ids."""
    rows = max(c.batch_sizes)
    tok = asm.tokenizer
    if tok is None:  # random weights: deterministic prompts of 5..20 ids
        gen = random.Random(0)
        vocab = asm.model.dims.vocab_size
        return [[gen.randrange(1, vocab) for _ in range(5 + (3 * i) % 16)] for i in range(rows)]
    out = []
    for text in list(c.prompts)[:rows]:
        chat = c.chat and tok.chat_template is not None
        out.append(list(tok.encode_chat([{"role": "user", "content": text}]) if chat else tok.encode(text)))
    return out


def build_systems(c, cfg, asm, max_len: int) -> list[BatchSystem]:
    systems: list[BatchSystem] = []
    for layout in c.kv_layouts:
        kv = KvSpec(layout="latent" if asm.model.latent_slots is not None else layout, block_size=cfg.kv.block_size or 16)
        for backend in c.backends:
            spec = dataclasses.replace(asm.setup.backend, name=backend)
            systems.append(FuelpipeBatch(asm.model, spec, kv, max(c.batch_sizes), max_len))
    path = checkpoint_gguf(cfg.model)
    shared: dict = {}
    systems += [TransformersBatch(path, mode, shared) for mode in c.transformers]
    if c.llama_cpp:
        s = LlamaCppBatch(None, torch.get_num_threads(), max_len + 8, max(c.batch_sizes))
        if path is None and not s.missing:
            s.missing = "needs the checkpoint as a GGUF file (model.weights=shipped or gguf)"
        elif not s.missing:
            from fuelpipe.bench.peers.f32_gguf import f32_gguf_path
            from fuelpipe.weights.named import cache_dir

            s.path = f32_gguf_path(path, cache_dir())
        systems.append(s)
    return systems


def run_bench_batch(c, cfg, asm, on_progress: Optional[Callable[[], None]] = None) -> dict:
    tick = on_progress or (lambda: None)
    t_start = time.perf_counter()
    prompts = bench_prompts(c, asm)
    n = c.new_tokens
    max_len = max(len(p) for p in prompts) + max(n, max(c.continuous.new_tokens))
    systems = build_systems(c, cfg, asm, max_len)
    load_before = os.getloadavg()
    bandwidth = measure_in_subprocess(torch.get_num_threads())
    gemm = measure_gemm_gflops()
    live = [s for s in systems if not s.missing]
    for s in live:
        s.setup()
    # 1. each system's own B = 1 tokens for every prompt: the reference rows are checked against
    refs: dict[str, list[list[int]]] = {}
    for s in list(live):
        try:
            refs[s.name] = [s.run([p], n).tokens[0] for p in prompts]
        except Exception as err:  # a peer that cannot run here is reported, not fatal
            s.missing = f"failed: {type(err).__name__}: {err}"
            live.remove(s)
        tick()
    # 2. warm-up pass, then timed passes; systems interleaved inside each batch size
    timings: dict[tuple[str, int], list] = {}
    for rep in range(1 + c.reps):
        for b in c.batch_sizes:
            for s in live:
                result = s.run(prompts[:b], n)
                if rep > 0:
                    timings.setdefault((s.name, b), []).append(result)
                tick()
    floor = scaling_floor(asm.model, prompts, n, bandwidth.gb_s, gemm, list(c.batch_sizes))
    rows = []
    for s in systems:
        for b in c.batch_sizes:
            rows.append(_row(s, b, timings.get((s.name, b), []), refs.get(s.name), n, floor[b]))
    _ratios(rows)
    continuous = [continuous_run(s, c.continuous, prompts, tick) for s in live if isinstance(s, FuelpipeBatch)]
    load_after = os.getloadavg()
    return {
        "model": cfg.model.size, "dtype": cfg.model.dtype.value, "new_tokens": n, "reps": c.reps,
        "batch_sizes": list(c.batch_sizes), "prompt_tokens": [len(p) for p in prompts],
        "systems": [{"system": s.name, "group": s.group, "missing": s.missing, **(s.details() if not s.missing else {})}
                    for s in systems],
        "rows": rows, "floor": {"bandwidth_gb_s": bandwidth.gb_s, "bandwidth_method": bandwidth.method,
                                "gemm_gflops": gemm, "per_batch": {str(b): f for b, f in floor.items()}},
        "continuous": continuous, "verdict": verdict(rows, 8),
        "env": {"threads": torch.get_num_threads(), "cpu": cpu_name(), "cpu_extensions": speed_extensions(),
                "torch": torch.__version__,
                "versions": peer_versions(), "git": git_hash(), "peak_rss_mb": peak_rss_mb(),
                "load_avg_1m_before": load_before[0], "load_avg_1m_after": load_after[0]},
        "wall_s": time.perf_counter() - t_start,
    }


def _row(s: BatchSystem, b: int, runs: list, refs: Optional[list[list[int]]], n: int, floor: dict) -> dict:
    row = {"system": s.name, "group": s.group, "batch": b}
    if s.missing:
        return row | {"status": "missing", "why": s.missing}
    best = min(runs, key=lambda r: r.wall_s)
    equal = [best.tokens[i] == refs[i] for i in range(b)]
    counted = sum(equal) * n
    wall = statistics.median(r.wall_s for r in runs)
    decode = [r.decode_s / (b * r.decode_steps) for r in runs if r.decode_s]
    row |= {"status": "ok" if all(equal) else "rows differ from B=1", "rows_equal": sum(equal),
            "tokens_per_s": counted / wall, "ms_per_token_per_request": 1000.0 * wall / n, "wall_s": wall,
            "decode_tokens_per_s": 1.0 / statistics.median(decode) if decode else None,
            "floor_tokens_per_s": floor["tokens_per_s"], "floor_bound": floor["bound"]}
    row["of_floor"] = (row["decode_tokens_per_s"] or row["tokens_per_s"]) / floor["tokens_per_s"]
    return row


def _ratios(rows: list[dict]) -> None:
    """Each row's aggregate tokens/s against the best counted transformers mode at the same B."""
    for b in {r["batch"] for r in rows}:
        peers = [r for r in rows if r["batch"] == b and r["group"] == "transformers" and r.get("tokens_per_s")]
        best = max(peers, key=lambda r: r["tokens_per_s"], default=None)
        for r in rows:
            if r["batch"] == b and r.get("tokens_per_s") and best is not None:
                r["over_best_transformers"] = r["tokens_per_s"] / best["tokens_per_s"]
                r["best_transformers"] = best["system"]


# The batched-decode targets (issue 33): fuelpipe's best tokens/s over the best transformers mode, and over
# llama.cpp's batched decode, at the verdict's batch size.
TARGET_OVER_TRANSFORMERS = 2.5
TARGET_OVER_LLAMA_CPP = 1.2


def verdict(rows: list[dict], b: int) -> dict:
    """The targets at batch size ``b``: fuelpipe's best against the best transformers mode and llama.cpp."""
    at = [r for r in rows if r["batch"] == b and r.get("tokens_per_s")]
    if not at:
        return {"batch": b, "measured": False}
    best = lambda group: max((r for r in at if r["group"] == group), key=lambda r: r["tokens_per_s"], default=None)
    mine, hf, lcpp = best("fuelpipe"), best("transformers"), best("llama.cpp")
    out = {"batch": b, "measured": True, "fuelpipe": mine and mine["system"],
           "fuelpipe_tokens_per_s": mine and mine["tokens_per_s"]}
    if mine and hf:
        ratio = mine["tokens_per_s"] / hf["tokens_per_s"]
        out |= {"transformers": hf["system"], "over_transformers": ratio,
                "target_over_transformers": TARGET_OVER_TRANSFORMERS, "over_transformers_met": ratio >= TARGET_OVER_TRANSFORMERS}
    if mine and lcpp:
        ratio = mine["tokens_per_s"] / lcpp["tokens_per_s"]
        out |= {"over_llama_cpp": ratio, "target_over_llama_cpp": TARGET_OVER_LLAMA_CPP,
                "over_llama_cpp_met": ratio >= TARGET_OVER_LLAMA_CPP}
    return out


# ---- the scaling floor ------------------------------------------------------------------------
def measure_gemm_gflops(size: int = 1024, repeats: int = 5) -> float:
    """Best f32 GEMM rate on this process's threads (a square matmul): the compute roof of the floor."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - t0) / 1e9)
    return best


def scaling_floor(model, prompts, n: int, gb_s: float, gflops: float, sizes: list[int]) -> dict[int, dict]:
    """Per B: the fastest a decode step of B rows can be, and which resource binds.

    Bytes: every weight once per step, plus each row's live KV (mean context of the run).
    FLOPs: 2 per weight element per row (the matmuls), plus attention (QK and PV, 4 x heads x
    head_dim x live positions per layer per row). step = max(bytes / bandwidth, flops / GEMM rate).
    """
    d = model.dims
    elem = next(model.parameters()).element_size()
    weights = weight_bytes_per_token(model)
    live = statistics.mean(len(p) for p in prompts[: max(sizes)]) + n / 2.0
    kv_row = kv_bytes_read(d.n_layers, d.n_kv_heads, d.head_dim, live, elem)
    flops_row = 2.0 * weights / elem + 4.0 * d.n_layers * d.n_heads * d.head_dim * live
    out = {}
    for b in sizes:
        memory_s = (weights + b * kv_row) / (gb_s * 1e9)
        compute_s = b * flops_row / (gflops * 1e9)
        step = max(memory_s, compute_s)
        out[b] = {"tokens_per_s": b / step, "bound": "bandwidth" if memory_s >= compute_s else "compute",
                  "memory_ms": 1000 * memory_s, "compute_ms": 1000 * compute_s, "weight_bytes": weights,
                  "kv_bytes_per_row": kv_row}
    return out


# ---- continuous batching with arrivals ---------------------------------------------------------
def continuous_run(system: FuelpipeBatch, r, prompts: list[list[int]], tick) -> dict:
    """``r.requests`` requests arriving over time (seeded exponential gaps), mixed prompt and output lengths."""
    from fuelpipe.batch import ContinuousBatcher, Request

    gen = random.Random(r.seed)
    outs = [list(r.new_tokens)[i % len(r.new_tokens)] for i in range(r.requests)]
    gen.shuffle(outs)
    arrivals, t = [], 0.0
    for _ in range(r.requests):
        arrivals.append(t)
        t += gen.expovariate(r.arrival_rate)
    requests = [Request(tuple(prompts[i % len(prompts)]), outs[i], name=str(i)) for i in range(r.requests)]
    done_at: dict[int, float] = {}
    batcher: Optional[ContinuousBatcher] = None

    def on_token(index: int, _token: int) -> None:
        res = batcher.results[index]
        if len(res.tokens) >= res.request.max_new_tokens:  # its last token (greedy, no stop ids)
            done_at[index] = time.perf_counter()

    batcher = system.batcher(on_token=on_token)  # the timed passes' cache and plans: serving, not building
    warmed = warm_buckets(batcher.decoder)  # buckets the timed batch sizes never used (a server builds them first)
    before_builds = batcher.decoder.builds
    t0 = time.perf_counter()
    submitted = 0
    while True:
        now = time.perf_counter() - t0
        while submitted < len(requests) and arrivals[submitted] <= now:
            batcher.submit(requests[submitted])
            submitted += 1
        if batcher.step():
            continue
        if submitted == len(requests):
            break
        time.sleep(max(0.0, arrivals[submitted] - (time.perf_counter() - t0)))  # idle until the next arrival
    total = time.perf_counter() - t0
    tick()
    latency = sorted(1000.0 * (done_at[i] - t0 - arrivals[i]) for i in done_at)
    tokens = sum(len(x.tokens) for x in batcher.results)
    return {"system": system.name, "requests": r.requests, "arrival_rate": r.arrival_rate, "total_s": total,
            "tokens": tokens, "tokens_per_s": tokens / total if total else None,
            "latency_ms_p50": _pct(latency, 50), "latency_ms_p99": _pct(latency, 99),
            "finished": len(done_at), "mean_batch": batcher.describe()["mean_batch"], "buckets_warmed_first": warmed,
            "builds_during_run": batcher.decoder.builds - before_builds}


def warm_buckets(decoder) -> list[int]:
    """Build the held plan of every bucket ``decoder`` has not used yet, with one throwaway step on that many
    fresh rows (released after). Returns the buckets built."""
    todo = [b for b in decoder.spec.buckets if b not in decoder.plans]
    for bucket in todo:
        rows = [decoder.kv.acquire() for _ in range(bucket)]
        try:
            for row in rows:
                row.reserve(2)
            logits = decoder.prefill(rows, [[0]] * bucket)
            decoder.step(rows, [int(t) for t in logits.argmax(-1)])
        finally:
            for row in rows:
                decoder.kv.release(row)
    return todo


def _pct(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(q / 100.0 * (len(xs) - 1)))))
    return xs[k]
