"""The ``peers`` stage (``experiment=bench_peers``): fuelpipe against transformers, llama.cpp and the floor.

Config at ``experiment.peers``; results under ``peers`` in results.json; ``peers.md`` and
``peers.png`` beside it and in ``record_dir``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from fuelpipe.errors import ConfigError
from fuelpipe.registry import did_you_mean
from fuelpipe.stages import StageSpec


@dataclass
class PeersConfig:
    """``experiment=bench_peers``: fuelpipe against transformers, llama.cpp and the bandwidth floor."""

    enabled: bool = False
    prompt_tokens: int = 16  # the first N ids of the first prompt
    new_tokens: int = 64
    reps: int = 3  # timed repetitions per system, after one warm-up
    backends: List[str] = field(default_factory=lambda: ["eager", "fx", "inductor"])
    plans: List[str] = field(default_factory=lambda: ["plan_once", "replan"])
    kv_layouts: List[str] = field(default_factory=lambda: ["contiguous", "paged"])
    # New tokens a replan row generates (it builds a program per token; inductor and aot compile per token).
    replan_new_tokens: Dict[str, int] = field(default_factory=lambda: {"eager": 64, "fx": 16, "inductor": 3, "aot": 3})
    transformers: List[str] = field(default_factory=lambda: ["dynamic", "static", "static_compile"])
    llama_cpp: bool = True  # reported as "not installed" when llama-cpp-python is absent
    # Run every transformers and llama.cpp row in its own worker process: a peer that crashes (a signal in
    # native code) becomes that row's status and the run goes on. False: everything in this process.
    isolate: bool = True
    # Low-bit rows (weights.dtype kinds): the same checkpoint packed at load, plan_once on a contiguous
    # cache for each of ``quantized_backends``, beside llama.cpp Q8_0 (written from the F32 file) and the
    # original file. Their greedy agreement with the reference is reported like every row's. An entry is a
    # kind (activations as weights.activations) or kind:activations, e.g. int8:f32 beside int8 (16-bit).
    quantized: List[str] = field(default_factory=lambda: ["int8", "int4"])
    quantized_backends: List[str] = field(default_factory=lambda: ["fx", "inductor"])
    # Each quantized row again on each of these kernel vector paths (fuelpipe.kernels.build), side by side in
    # one run; empty: the path the kernels take by themselves. A path this CPU lacks is reported, not run.
    vector_paths: List[str] = field(default_factory=list)
    # Each f32 fuelpipe row again with the f32 rows kernel's software prefetch forced to each of these distances
    # in bytes (0: none), side by side in one run; empty: the distance measured at load (path_choice).
    f32_prefetch: List[int] = field(default_factory=list)
    record_dir: Optional[str] = None  # also write peers.md / peers.png here (a study folder under experiments/)



QUANTIZED_ROWS = ["bf16", "int8", "int4", "int8:f32", "int4:f32", "int8:int16", "int4:int16", "int8:int8", "int4:int8"]


def validate(p) -> list[str]:
    from fuelpipe.bench.peers.systems import TransformersSystem
    from fuelpipe.modes import RUNNABLE_PLAN_MODES
    from fuelpipe.kv.layout import layout_names
    from fuelpipe.plan.backends import BACKENDS

    reasons = []
    for key, values, allowed in (
        ("backends", p.backends, BACKENDS),
        ("plans", p.plans, [m.value for m in RUNNABLE_PLAN_MODES]),
        ("kv_layouts", p.kv_layouts, [x for x in layout_names() if x != "latent"]),
        ("transformers", p.transformers, TransformersSystem.MODES),
        ("quantized", p.quantized, QUANTIZED_ROWS),
        ("vector_paths", p.vector_paths, ["scalar", "avx2", "avx_vnni", "avx512"]),
        ("quantized_backends", p.quantized_backends, BACKENDS),
    ):
        for v in values:
            if v not in allowed:
                reasons.append(did_you_mean(f"experiment.peers.{key} entry", v, allowed))
    for v in p.f32_prefetch:
        if not 0 <= v <= 65536:
            reasons.append(f"experiment.peers.f32_prefetch entries must be in [0, 65536] bytes, got {v}")
    if len(set(p.f32_prefetch)) != len(p.f32_prefetch):
        reasons.append(f"experiment.peers.f32_prefetch entries must be distinct (each names a row), got {list(p.f32_prefetch)}")
    for key in ("prompt_tokens", "new_tokens", "reps"):
        if p[key] < 1:
            reasons.append(f"experiment.peers.{key} must be >= 1, got {p[key]}")
    if p.new_tokens < 3:
        reasons.append(f"experiment.peers.new_tokens must be >= 3 (a step time needs two decode steps), got {p.new_tokens}")
    for backend, n in p.replan_new_tokens.items():
        if backend not in BACKENDS:
            reasons.append(did_you_mean("experiment.peers.replan_new_tokens key", backend, BACKENDS))
        elif n < 3:
            reasons.append(f"experiment.peers.replan_new_tokens.{backend} must be >= 3, got {n}")
    return reasons



def check_loaded(p, asm) -> list[str]:
    """The prompt and lengths against the loaded model (its tokenizer, its position limit)."""
    from fuelpipe.bench.peers.experiment import peers_prompt

    limit = asm.model.dims.max_position_embeddings
    try:
        peers_prompt(asm, p.prompt_tokens)  # needs the encoded prompt
    except ConfigError as err:
        return [str(err)]
    if p.prompt_tokens + p.new_tokens > limit:
        return [f"experiment.peers.prompt_tokens + new_tokens = {p.prompt_tokens + p.new_tokens} exceeds the "
                f"model's max_position_embeddings {limit}"]
    return []


def progress_steps(p) -> int:
    fuelpipe_rows = len(p.backends) * len(p.plans) * len(p.kv_layouts) * (1 + len(p.f32_prefetch))
    return (fuelpipe_rows + len(p.transformers) + 2 * p.llama_cpp) * (1 + p.reps)


def run(p, cfg, asm, output_dirs: list[Path]) -> dict:
    from fuelpipe.bench.peers.experiment import run_peers, write_outputs
    from fuelpipe.progress import bar

    with bar(progress_steps(p), "fuelpipe bench_peers") as progress:
        doc = run_peers(cfg, asm, on_progress=lambda _: progress.update())
    doc["written"] = write_outputs(doc, output_dirs + ([Path(p.record_dir)] if p.record_dir else []))
    return doc


def render(doc: dict) -> str:
    from fuelpipe.bench.peers.report import markdown

    return "\n".join([markdown(doc)] + [f"written: {w}" for w in doc.get("written", [])])


STAGE = StageSpec("peers", PeersConfig, run, validate, check_loaded, render, progress_steps=progress_steps)
