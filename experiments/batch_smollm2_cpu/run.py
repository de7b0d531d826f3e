"""Study: 8 concurrent requests on the real SmolLM2-135M, against their solo runs, in one process.

    python experiments/batch_smollm2_cpu/run.py [--out experiments/batch_smollm2_cpu] [--new-tokens 48]

1. Correctness: 8 greedy chat requests of different prompt lengths and token budgets through one
   ContinuousBatcher (batch.max_batch = 8, buckets 1, 2, 4, 8: rows leave one by one, the batch
   moves down the buckets); each request's tokens against its own solo ``ctx.generate`` (B = 1,
   the single-sequence held plan).
2. Throughput, side by side in one run (interleaved repetitions, medians): decode tokens/s of one
   stream (B = 1, the single-sequence plan) and of the batch (8 rows per step), both fx plan_once.
3. Memory: KV bytes per row, plans held, their own buffers and the weight copies they hold.

Writes results.json and a short report.md into --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import torch

from fuelpipe.machine import cpu_name
from fuelpipe.batch import BatchSpec, ContinuousBatcher, Request
from fuelpipe.context import InferenceContext
from fuelpipe.weights.loader import load_named

PROMPTS = [
    "Hi!",
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a cache that forgets nothing.",
    "List three prime numbers larger than one hundred and say why each one is prime.",
    "Summarise the plot of a story in which a lighthouse keeper finds a message in a bottle, in one paragraph.",
    "You are a careful engineer. Describe, step by step, how you would check that a batched decoder gives "
    "exactly the same answers as decoding each request on its own.",
    "Translate to French: The quick brown fox jumps over the lazy dog while the cat watches from the window "
    "and the rain keeps falling on the old roof of the house by the sea.",
]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def solo_stream(ctx: InferenceContext, ids: list[int], n: int, width: int) -> tuple[list[int], float]:
    """(tokens, decode tokens/s) of one request alone (B = 1)."""
    res = ctx.generate(ids, n, max_seq_len=width)
    steps = res.decode_s[1:]  # the first decode step builds (or rebinds) the plan
    return res.tokens, len(steps) / sum(steps)


def batched(ctx: InferenceContext, requests: list[Request], width: int, spec: BatchSpec):
    kv = ctx.new_batch_cache(spec.max_batch, width)
    b = ContinuousBatcher(ctx, kv, spec)
    results = b.run(requests)
    return b, results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    loaded = load_named("smollm2_135m")
    model, tok = loaded.model, loaded.tokenizer
    ids = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    n = args.new_tokens
    width = max(len(i) for i in ids) + n
    spec = BatchSpec(8, (1, 2, 4, 8))
    # greedy, no stop; budgets n, n - 4, ...: rows leave one by one and the batch moves down the buckets
    requests = [Request(tuple(i), n - 4 * k, name=f"p{k}") for k, i in enumerate(ids)]

    # 1. correctness: each request batched vs alone
    ctx = InferenceContext(model, "fx", "plan_once")
    b, results = batched(ctx, requests, width, spec)
    solo_ctx = InferenceContext(model, "fx", "plan_once")
    same = []
    for req, res in zip(requests, results):
        tokens, _ = solo_stream(solo_ctx, list(req.prompt_ids), req.max_new_tokens, width)
        same.append(res.tokens == tokens)
    d = b.describe()

    # 2. throughput, interleaved: one stream vs the batch of 8, same process, same plans held
    one, eight = [], []
    for _ in range(args.reps):
        _, tps = solo_stream(solo_ctx, ids[2], n, width)
        one.append(tps)
        t = ContinuousBatcher(ctx, ctx.new_batch_cache(8, width), spec)
        t.run([Request(r.prompt_ids, n, name=r.name) for r in requests])  # all n tokens: 8 rows every step
        full = [i for i, size in enumerate(t.batch_sizes) if size == 8][1:]  # 8-row steps, past the first
        eight.append(8 * len(full) / sum(t.step_s[i] for i in full))
    ratio = statistics.median(eight) / statistics.median(one)
    record = {
        "commit": _commit(), "torch": torch.__version__, "cpu": cpu_name(), "threads": torch.get_num_threads(),
        "model": "smollm2_135m f32", "backend": "fx", "plan": "plan_once", "offset_mode": ctx.offset_mode,
        "prompt_tokens": [len(i) for i in ids], "new_tokens": [r.max_new_tokens for r in requests],
        "row_capacity": width, "batch_sizes": b.batch_sizes,
        "tokens_equal_solo": same, "all_equal": all(same),
        "b1_tokens_per_s": one, "b8_tokens_per_s": eight,
        "b1_median": statistics.median(one), "b8_median": statistics.median(eight), "ratio_b8_over_b1": ratio,
        "kv_bytes_per_row": d["bytes_per_row"], "plans_held": d["plans_held"],
        "builds_per_bucket": d["builds_per_bucket"], "plan_buffer_bytes": d["plan_buffer_bytes"],
        "plan_weight_bytes": d["plan_weight_bytes"], "mean_batch": d["mean_batch"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
