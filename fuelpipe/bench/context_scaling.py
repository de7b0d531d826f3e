"""Decode ms/token as the context grows, per KV strategy (``experiment=bench_context``).

For each context length L the cache is brought to L live positions and then
``tokens`` decode steps are timed. Reaching L by prefilling L real tokens
would cost minutes at 4096 on a CPU and changes nothing a decode step does
(its cost depends on how many positions it reads, not on their values), so
the first L positions are filled with random K/V and the cache is advanced.
Every arm keeps one held plan across lengths where its geometry allows.

Arms (all through the configured backend, plan_once):

* ``contiguous tensor``: the device-offset path; attends the whole
  capacity under a mask. Capacity fixed at the largest length, as a server
  would size it, so its cost should not grow with L.
* ``contiguous symbol``: the symbol path; attends only the live prefix.
* ``contiguous sized``: capacity = L + tokens, rebuilt per length,
  to show the tensor path's cost tracks capacity, not context.
* ``paged``: block pool + padded block table (capacity fixed as above); gathers every
  table entry, padding included.
* ``paged symbol``: the same pool on the symbol path; gathers only the live blocks.

Batched decode (several sequences per step) does not exist in fuelpipe, so
there is no batch axis.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from fuelpipe.bench.decode import percentile
from fuelpipe.context import InferenceContext
from fuelpipe.modes import PlanMode
from fuelpipe.plan.backends import BackendSpec

ARMS = ("contiguous tensor", "contiguous symbol", "contiguous sized", "paged", "paged symbol")


@dataclass(frozen=True)
class Arm:
    name: str
    layout: str  # contiguous | paged
    offset_mode: str  # tensor | symbol
    sized: bool  # capacity follows the context length


ARM_SPECS = {
    "contiguous tensor": Arm("contiguous tensor", "contiguous", "tensor", False),
    "contiguous symbol": Arm("contiguous symbol", "contiguous", "symbol", False),
    "contiguous sized": Arm("contiguous sized", "contiguous", "tensor", True),
    "paged": Arm("paged", "paged", "tensor", False),
    "paged symbol": Arm("paged symbol", "paged", "symbol", False),
}


def filled_cache(ctx: InferenceContext, arm: Arm, length: int, capacity: int, block_size: int, gen: torch.Generator):
    """A cache of ``capacity`` positions whose first ``length`` hold random K/V.

    The same generator state gives the same logical K/V in every layout, so arms can be compared.
    """
    d = ctx.model.dims

    def draw(dtype):  # one layer's K or V for positions [0, length): [1, Hkv, L, D]
        return torch.randn((1, d.n_kv_heads, length, d.head_dim), generator=gen).to(dtype)

    if arm.layout == "paged":
        cap_blocks = -(-capacity // block_size)
        seq = ctx.new_pool(cap_blocks + 1, block_size).sequence(cap_blocks)
        seq.check_room(0, length)  # allocates the blocks for [0, length)
        rows = seq.write_index(0, length)  # [L] flat pool offsets
        for pool in seq.bound_tensors():  # [NB, bs, Hkv, D]
            pool.view(-1, d.n_kv_heads, d.head_dim)[rows] = draw(pool.dtype)[0].transpose(0, 1)
        seq.advance(length)
        return seq
    cache = ctx.new_cache(capacity)
    for t in cache.bound_tensors():  # [1, Hkv, S, D]
        t[:, :, :length] = draw(t.dtype)
    cache.advance(length)
    cache.bump_all_versions()
    return cache


def run_context_scaling(
    model,
    backend: BackendSpec,
    lengths: list[int],
    arms: list[str],
    tokens: int,
    warmup: int,
    block_size: int = 16,
    on_progress: Optional[Callable[[], None]] = None,
) -> list[dict]:
    top = max(lengths) + warmup + tokens
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in arms:
        arm = ARM_SPECS[name]
        ctx = InferenceContext(model, backend, PlanMode.plan_once, offset_mode=arm.offset_mode)
        for length in lengths:
            capacity = length + warmup + tokens if arm.sized else top
            cache = filled_cache(ctx, arm, length, capacity, block_size, gen)
            builds_before = ctx.plan.stats.builds
            token, times = 1, []
            for i in range(warmup + tokens):
                t0 = time.perf_counter()
                logits = ctx.decode(cache, token)
                dt = 1000.0 * (time.perf_counter() - t0)
                token = int(logits.argmax())
                if i >= warmup:
                    times.append(dt)
            rows.append({
                "arm": name, "context": length, "capacity": capacity,
                "ms_per_token": statistics.median(times), "p10_ms": percentile(times, 10),
                "p90_ms": percentile(times, 90), "tokens": tokens,
                "plan_builds": ctx.plan.stats.builds - builds_before,
                "kv_bytes_attended_per_token": _attended_bytes(model, arm, length, capacity, block_size),
            })
            if on_progress:
                on_progress()
    return rows


def _attended_bytes(model, arm: Arm, length: int, capacity: int, block_size: int) -> int:
    d = model.dims
    elem = next(model.parameters()).element_size()
    if arm.offset_mode == "symbol" and arm.layout == "paged":
        positions = -(-(length + 1) // block_size) * block_size  # the live blocks, this step's token included
    elif arm.offset_mode == "symbol":
        positions = length + 1
    elif arm.layout == "paged":
        positions = -(-capacity // block_size) * block_size
    else:
        positions = capacity
    return 2 * d.n_layers * d.n_kv_heads * d.head_dim * positions * elem


def markdown(doc: dict) -> str:
    rows = doc["rows"]
    lengths = sorted({r["context"] for r in rows})
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    ms = {(r["arm"], r["context"]): r for r in rows}
    lines = [
        f"# Decode ms/token vs context: {doc['model']} ({doc['dtype']}), backend {doc['backend']}, plan_once, "
        f"{doc['threads']} threads",
        "",
        f"Median of {doc['tokens']} decode steps after {doc['warmup']} warm-up steps per length; fixed-capacity arms "
        f"hold {max(r['capacity'] for r in rows)} positions, the `sized` arm exactly the length plus the steps. "
        "Cells: ms/token, p10-p90 of the steps in parentheses, plan builds at that length in brackets when not 0. "
        "The second table: KV MB each step attends.",
        "",
        "| arm | " + " | ".join(str(n) for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for a in arms:
        cells = []
        for n in lengths:
            r = ms[(a, n)]
            cells.append(f"{r['ms_per_token']:.1f} ({r['p10_ms']:.0f}-{r['p90_ms']:.0f})"
                         + (f" [{r['plan_builds']}]" if r["plan_builds"] else ""))
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "| KV MB attended | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for a in arms:
        lines.append(f"| {a} | " + " | ".join(f"{ms[(a, n)]['kv_bytes_attended_per_token'] / 1e6:.1f}" for n in lengths)
                     + " |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a in dict.fromkeys(r["arm"] for r in doc["rows"]):
        rs = sorted((r for r in doc["rows"] if r["arm"] == a), key=lambda r: r["context"])
        x = [r["context"] for r in rs]
        y = [r["ms_per_token"] for r in rs]
        err = [[r["ms_per_token"] - r["p10_ms"] for r in rs], [r["p90_ms"] - r["ms_per_token"] for r in rs]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=2, label=a)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (live positions)")
    ax.set_ylabel("decode ms/token (median, p10-p90)")
    ax.set_title(f"{doc['model']} {doc['dtype']}, {doc['backend']} plan_once, {doc['threads']} threads", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
