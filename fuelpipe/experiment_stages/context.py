"""The ``context`` stage (``experiment=bench_context``): decode ms/token as the live context grows, per KV arm.

Config at ``experiment.context``; results under ``context_scaling`` in results.json;
``context.md`` and ``context.png`` beside it and in ``record_dir``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from fuelpipe.registry import did_you_mean
from fuelpipe.stages import StageSpec


@dataclass
class ContextScalingConfig:
    """``experiment=bench_context``: decode ms/token as the live context grows, per KV strategy."""

    enabled: bool = False
    lengths: List[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048, 4096])
    arms: List[str] = field(default_factory=lambda: [
        "contiguous tensor", "contiguous symbol", "contiguous sized", "paged", "paged symbol"])
    tokens: int = 16  # timed decode steps per length
    warmup: int = 2  # untimed steps first (the plan build, when there is one, lands here)
    record_dir: Optional[str] = None  # also write context.md / context.png here



def validate(c) -> list[str]:
    from fuelpipe.bench.context_scaling import ARMS

    reasons = [did_you_mean("experiment.context.arms entry", a, ARMS) for a in c.arms if a not in ARMS]
    if not c.arms:
        reasons.append("experiment.context.arms is empty: name at least one of " + ", ".join(ARMS))
    if not c.lengths or min(c.lengths) < 1:
        reasons.append(f"experiment.context.lengths must be non-empty and >= 1, got {list(c.lengths)}")
    if c.tokens < 1 or c.warmup < 1:
        reasons.append(f"experiment.context needs tokens >= 1 and warmup >= 1 (the build step), "
                       f"got tokens={c.tokens} warmup={c.warmup}")
    return reasons


def check_loaded(c, asm) -> list[str]:
    limit = asm.model.dims.max_position_embeddings
    if max(c.lengths) + c.warmup + c.tokens > limit:
        return [f"experiment.context.lengths reach {max(c.lengths)} + {c.warmup + c.tokens} decode steps, "
                f"beyond the model's max_position_embeddings {limit}"]
    return []


def progress_steps(c) -> int:
    return len(c.arms) * len(c.lengths)


def run(c, cfg, asm, output_dirs: list[Path]) -> dict:
    from fuelpipe.bench import context_scaling as cs
    from fuelpipe.progress import bar

    with bar(progress_steps(c), "fuelpipe bench_context") as progress:
        rows = cs.run_context_scaling(
            asm.model, asm.setup.backend, list(c.lengths), list(c.arms), c.tokens, c.warmup,
            block_size=cfg.kv.block_size or 16, on_progress=progress.update,
        )
    doc = {"model": cfg.model.size, "dtype": cfg.model.dtype.value, "backend": asm.setup.backend.name,
           "threads": asm.threads, "tokens": c.tokens, "warmup": c.warmup, "rows": rows, "written": []}
    for d in output_dirs + ([Path(c.record_dir)] if c.record_dir else []):
        d.mkdir(parents=True, exist_ok=True)
        (d / "context.md").write_text(cs.markdown(doc))
        cs.plot(doc, d / "context.png")
        doc["written"] += [str(d / "context.md"), str(d / "context.png")]
    return doc


def render(doc: dict) -> str:
    from fuelpipe.bench.context_scaling import markdown

    return "\n".join([markdown(doc)] + [f"written: {w}" for w in doc.get("written", [])])


STAGE = StageSpec("context", ContextScalingConfig, run, validate, check_loaded, render,
                  results_key="context_scaling", progress_steps=progress_steps)
