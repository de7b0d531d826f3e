"""KV memory and decode speed of kv=ring against kv=contiguous on Gemma 3 270M, side by side in one process.

    python experiments/ring_kv_gemma3/run.py [--context 4096] [--prompt 700] [--tokens 32] [--backend aot]

For each layout: a cache of ``--context`` positions (its bytes, as allocated), the same prompt of
``--prompt`` tokens (longer than the 512-position window, so every ring wraps in the prefill),
then ``--tokens`` greedy decode steps. Reports the KV bytes, prefill seconds, decode ms/token
(median of the steps after the first) and whether the greedy tokens agree.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

import fuelpipe
from fuelpipe.kv.spec import KvSpec

HERE = Path(__file__).parent


def run_layout(ctx, layout: str, prompt: list[int], context: int, tokens: int) -> dict:
    cache = KvSpec(layout).new_cache(ctx, context)
    t0 = time.perf_counter()
    logits = ctx.prefill(cache, prompt)
    prefill_s = time.perf_counter() - t0
    out, steps = [], []
    for _ in range(tokens):
        tok = int(logits.argmax())
        out.append(tok)
        t0 = time.perf_counter()
        logits = ctx.decode(cache, tok)
        steps.append(time.perf_counter() - t0)
    return {"layout": layout, "kv_bytes": cache.nbytes(), "kv_mb": cache.nbytes() / 2**20, "prefill_s": prefill_s,
            "decode_ms_median": 1000 * statistics.median(steps[1:]), "decode_ms_first": 1000 * steps[0],
            "tokens": out, "builds": ctx.plan.stats.builds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=700)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--backend", default="aot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="results")
    a = ap.parse_args()
    lm = fuelpipe.load("gemma3_270m", backend=a.backend, threads=a.threads)
    ctx = lm.context
    text = (HERE.parent.parent / "docs" / "architecture.md").read_text() * 4  # a fixed, real-text prompt
    prompt = lm.tokenizer.encode(text)[: a.prompt]
    rows = [run_layout(ctx, layout, prompt, a.context, a.tokens) for layout in ("contiguous", "ring", "contiguous")]
    first, ring_row = rows[0], rows[1]
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    result = {
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "torch": torch.__version__, "cpu": model_name, "machine": platform.machine(), "threads": a.threads,
        "backend": a.backend, "context": a.context, "prompt_tokens": len(prompt), "decode_tokens": a.tokens,
        "windows": list(ctx.model.mask_plan.layer_types), "sliding_window": ctx.model.mask_plan.sliding_window,
        "rows": rows, "kv_ratio": first["kv_bytes"] / ring_row["kv_bytes"],
        "greedy_tokens_equal": first["tokens"] == ring_row["tokens"] == rows[2]["tokens"],
    }
    (HERE / f"{a.out}.json").write_text(json.dumps(result, indent=1))
    lines = [f"Gemma 3 270M, {a.backend}, {a.threads} threads, {model_name}, torch {torch.__version__}, "
             f"commit {result['commit']}; context {a.context}, prompt {len(prompt)} tokens, {a.tokens} decode steps",
             "", "| layout | KV MB | prefill s | decode ms/token (median) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layout']} | {r['kv_mb']:.1f} | {r['prefill_s']:.2f} | {r['decode_ms_median']:.2f} |")
    lines += ["", f"KV memory contiguous / ring: {result['kv_ratio']:.2f}x; greedy tokens equal on every row: "
              f"{result['greedy_tokens_equal']}"]
    (HERE / f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
