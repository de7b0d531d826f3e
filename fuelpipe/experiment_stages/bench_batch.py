"""The ``bench_batch`` stage (``experiment=bench_batch``): serving throughput against the peers a user would pick.

For each batch size B the same B prompts are generated (greedy, ``new_tokens`` each) by
every system, interleaved system by system. A row counts only when its tokens equal the
system's own B = 1 tokens for that prompt. Reported per (system, B): aggregate tokens/s
over the whole call (counted rows only), per-request ms/token (the call's wall time over
its tokens), and, for systems that report it, full-width decode tokens/s. A scaling
floor (weights read once per step, KV once per row, or the measured GEMM rate when that
binds) is computed for every B. A continuous-batching run then serves ``continuous.requests``
requests of mixed prompt and output lengths arriving over time.

Config at ``experiment.bench_batch``; results under ``bench_batch``; ``bench_batch.md``,
``bench_batch.csv`` and ``bench_batch.png`` beside results.json and in ``record_dir``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from fuelpipe.registry import did_you_mean
from fuelpipe.stages import StageSpec

DEFAULT_PROMPTS = [
    "What is the capital of France?", "Explain in two sentences why the sky is blue.",
    "Write a haiku about a cache that forgets nothing.", "List three prime numbers larger than one hundred.",
    "How does a bicycle stay upright?", "Describe a lighthouse at night.", "What is a GPU for?",
    "Give me a recipe for pancakes.", "Why do cats purr?", "Summarise the water cycle.",
    "What makes a good password?", "Tell me a short story about a robot who learns to paint.",
    "How do vaccines work?", "What is the difference between weather and climate?",
    "Suggest three names for a bakery.", "Explain recursion to a child.",
]


@dataclass
class ContinuousRunConfig:
    requests: int = 32
    arrival_rate: float = 4.0  # requests per second (exponential inter-arrival times, seeded)
    new_tokens: List[int] = field(default_factory=lambda: [16, 32, 48, 64])  # cycled, shuffled with the seed
    seed: int = 0


@dataclass
class BenchBatchConfig:
    enabled: bool = False
    batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    new_tokens: int = 64
    reps: int = 1  # timed passes after one untimed warm-up pass (plans, compiles)
    prompts: List[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))  # one per row; random weights: synthetic
    chat: bool = True  # wrap prompts in the checkpoint's chat template when it has one
    backends: List[str] = field(default_factory=lambda: ["fx"])
    kv_layouts: List[str] = field(default_factory=lambda: ["contiguous", "paged"])
    transformers: List[str] = field(default_factory=lambda: ["padded", "static", "static_compile", "continuous"])
    llama_cpp: bool = True  # reported as "not installed" when llama-cpp-python is absent
    continuous: ContinuousRunConfig = field(default_factory=ContinuousRunConfig)
    record_dir: Optional[str] = None  # also write bench_batch.md / .csv / .png here


def validate(c) -> list[str]:
    from fuelpipe.bench.batch_systems import TransformersBatch
    from fuelpipe.plan.backends import BACKENDS

    reasons = []
    sizes = list(c.batch_sizes)
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        reasons.append(f"experiment.bench_batch.batch_sizes must be distinct integers >= 1, got {sizes}")
    if c.new_tokens < 3:
        reasons.append(f"experiment.bench_batch.new_tokens must be >= 3 (a decode step needs two), got {c.new_tokens}")
    if c.reps < 1:
        reasons.append(f"experiment.bench_batch.reps must be >= 1, got {c.reps}")
    if sizes and len(c.prompts) < max(sizes):
        reasons.append(f"experiment.bench_batch.prompts holds {len(c.prompts)} prompts; the largest batch size "
                       f"{max(sizes)} needs one per row")
    for key, values, allowed in (("backends", c.backends, BACKENDS), ("kv_layouts", c.kv_layouts, ("contiguous", "paged")),
                                 ("transformers", c.transformers, TransformersBatch.MODES)):
        reasons += [did_you_mean(f"experiment.bench_batch.{key} entry", v, allowed) for v in values if v not in allowed]
    r = c.continuous
    if r.requests < 0 or r.arrival_rate <= 0 or not r.new_tokens or min(r.new_tokens) < 1:
        reasons.append(f"experiment.bench_batch.continuous needs requests >= 0, arrival_rate > 0 and new_tokens >= 1, "
                       f"got requests={r.requests} arrival_rate={r.arrival_rate} new_tokens={list(r.new_tokens)}")
    return reasons


def check_loaded(c, asm) -> list[str]:
    from fuelpipe.bench.batch_run import bench_prompts

    if asm.model.latent_slots is not None and "paged" in c.kv_layouts:
        return ["experiment.bench_batch.kv_layouts: an MLA model decodes from latent slots, not a paged pool"]
    prompts = bench_prompts(c, asm)
    need = max(len(p) for p in prompts) + max(c.new_tokens, max(c.continuous.new_tokens))
    limit = asm.model.dims.max_position_embeddings
    return [] if need <= limit else [f"experiment.bench_batch needs {need} positions per row, beyond the model's "
                                     f"max_position_embeddings {limit}"]


def progress_steps(c) -> int:
    systems = len(c.backends) * len(c.kv_layouts) + len(c.transformers) + int(c.llama_cpp)
    return systems * (1 + (1 + c.reps) * len(c.batch_sizes)) + len(c.backends) * len(c.kv_layouts)


def run(c, cfg, asm, output_dirs: list[Path]) -> dict:
    from fuelpipe.bench.batch_report import write_outputs
    from fuelpipe.bench.batch_run import run_bench_batch
    from fuelpipe.progress import bar

    with bar(progress_steps(c), "fuelpipe bench_batch") as progress:
        doc = run_bench_batch(c, cfg, asm, on_progress=progress.update)
    doc["written"] = write_outputs(doc, output_dirs + ([Path(c.record_dir)] if c.record_dir else []))
    return doc


def render(doc: dict) -> str:
    from fuelpipe.bench.batch_report import markdown

    return "\n".join([markdown(doc)] + [f"written: {w}" for w in doc.get("written", [])])


STAGE = StageSpec("bench_batch", BenchBatchConfig, run, validate, check_loaded, render, progress_steps=progress_steps)
