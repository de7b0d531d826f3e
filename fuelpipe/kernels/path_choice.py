"""Choices the kernels make by measurement on this CPU: vector paths, and the f32 kernel's prefetch distance.

A wider path is not always faster: on a 2-core Xeon with AVX-512 and AMX the 16-bit-activation int8 product
ran 1.32x faster on avx512 than on avx2 at one thread, and the 4-bit one 0.89x (experiments/vector_paths_cpu).
So each such kernel (``MEASURED``) is timed on every path this CPU runs, once per machine and build, on
eight distinct decoder layers of SmolLM2-135M's shapes (weights streamed from beyond the L2 cache, as in
decode) at one thread (the f32 rows kernel at ``BATCH_ROWS`` rows of x: its avx512 tile serves a batch step); the choice is stored beside the built library (``path_choice.json``, written atomically) and applied
at every load. A forced path (``$FUELPIPE_KERNEL_PATH``, ``forced_vector_path``) overrides it.

The f32 rows kernel (``f32_rows.cpp``) asks for each weight stream's lines a fixed distance ahead. Whether that
pays, and how far, depends on the CPU's prefetchers and memory, so ``PREFETCH_BYTES`` are timed the same way
(interleaved, one thread) on ``PREFETCH_LAYERS`` f32 layers, more than most last-level caches hold, and the
fastest is stored beside the paths (``f32_prefetch_bytes``). It is measured on every CPU with AVX2, paths
above it or not. A prefetch never changes a result, only when a line arrives.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

MEASURED = ("q8_gemv_a16", "q4_gemv_a16", "f32_rows_linear")
BATCH_ROWS = 8  # rows of x the f32 rows kernel is timed at: its avx512 tile serves several rows (a batch step)
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in): fused q/k/v, o, fused gate/up, down
LAYERS = 8  # distinct layers: 26 MB of int8 codes, beyond any L2
ROUNDS = 5
PREFETCH_BYTES = (0, 1024, 2048, 4096)  # candidate distances; 0: no software prefetch
PREFETCH_LAYERS = 12  # f32 layers of LAYER's shapes: 170 MB, beyond the L3 of most machines
FILE = "path_choice.json"
log = logging.getLogger(__name__)


def apply(folder: Path) -> dict[str, str]:
    """Loads (or measures and stores) the choices for this build folder and hands them to the kernels.

    Returns each measured kernel's path (empty where the CPU has nothing above avx2 to choose between)."""
    ops = torch.ops.fuelpipe_kernels
    runnable = list(ops.vector_paths())
    if "avx2" not in runnable:  # the scalar path alone: no path to choose, no prefetch in it
        return {}
    paths = [p for p in runnable if p not in ("scalar", "avx2")]
    choice = _read(folder / FILE, runnable, bool(paths))
    if choice is None:
        choice = measure(["avx2", *paths]) if paths else {"best": {}, "ms_per_layer": {}}
        choice.update(measure_prefetch())
        _write(folder / FILE, choice)
    for kernel, path in choice["best"].items():
        ops.set_measured_path(kernel, path)
    ops.set_f32_prefetch(int(choice["f32_prefetch_bytes"]))
    return dict(choice["best"])


def measure_prefetch() -> dict:
    """{"f32_prefetch_bytes": the fastest distance, "f32_prefetch_ms_per_layer": distance -> median ms}."""
    ops = torch.ops.fuelpipe_kernels
    before_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    before = ops.set_f32_prefetch(0)
    try:
        # Weights of ones: the kernel's speed does not depend on the values, and filling is fast.
        layers = [[torch.ones(n, k) for n, k in LAYER] for _ in range(PREFETCH_LAYERS)]
        xs = [torch.ones(1, k) for _, k in LAYER]

        def layer() -> None:
            for ws in layers:
                for w, x in zip(ws, xs):
                    ops.f32_rows_linear(x, [w], None)

        times: dict[int, list[float]] = {b: [] for b in PREFETCH_BYTES}
        for _ in range(ROUNDS):
            for ahead in PREFETCH_BYTES:
                ops.set_f32_prefetch(ahead)
                layer()
                start = time.perf_counter()
                layer()
                times[ahead].append((time.perf_counter() - start) * 1000.0 / PREFETCH_LAYERS)
    finally:
        ops.set_f32_prefetch(before)
        torch.set_num_threads(before_threads)
    ms = {b: statistics.median(t) for b, t in times.items()}
    best = min(ms, key=ms.get)
    log.info("f32 prefetch distance measured: %d bytes (%s)", best, ms)
    return {"f32_prefetch_bytes": best, "f32_prefetch_ms_per_layer": {str(b): round(v, 4) for b, v in ms.items()}}


def measure(paths: list[str]) -> dict:
    """{"best": kernel -> path, "ms": kernel -> path -> median ms per layer}, timed interleaved."""
    from fuelpipe.quant.formats import QuantKind

    gen = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    ops = torch.ops.fuelpipe_kernels
    out: dict = {"best": {}, "ms_per_layer": {}, "threads": 1, "layers": LAYERS, "layer": [list(s) for s in LAYER]}
    restore = ops.set_vector_path("auto")  # the setting before (a forced path, or "auto"), put back after
    try:
        for kernel, kind in zip(MEASURED, (QuantKind.int8, QuantKind.int4, None)):
            if kind is None:  # f32 weights, BATCH_ROWS rows of x
                layers = [[torch.ones(n, k) for n, k in LAYER] for _ in range(LAYERS)]
                xs = [torch.ones(BATCH_ROWS, k) for _, k in LAYER]
            else:
                layers = [[_random_packed(kind, n, k, gen) for n, k in LAYER] for _ in range(LAYERS)]
                xs = [torch.randn(1, k, generator=gen) for _, k in LAYER]

            def layer() -> None:  # every layer once: weights stream from beyond the L2 cache, as in decode
                for packed in layers:
                    for p, x in zip(packed, xs):
                        if kind is None:
                            ops.f32_rows_linear(x, [p], None)
                        elif kind is QuantKind.int8:
                            ops.q8_gemv_a16(x, p.q, p.scales, None)
                        else:
                            ops.q4_gemv_a16(x, p.q, p.scales, p.mins, None)

            times: dict[str, list[float]] = {p: [] for p in paths}
            for _ in range(ROUNDS):
                for path in paths:
                    ops.set_vector_path(path)  # called while the library loads: the op itself, not build's lock
                    layer()
                    start = time.perf_counter()
                    layer()
                    layer()
                    times[path].append((time.perf_counter() - start) * 500.0 / LAYERS)
            ms = {p: statistics.median(t) for p, t in times.items()}
            out["ms_per_layer"][kernel] = {p: round(v, 4) for p, v in ms.items()}
            out["best"][kernel] = min(ms, key=ms.get)
    finally:
        ops.set_vector_path(restore)
        torch.set_num_threads(before)
    log.info("kernel paths measured: %s", out["best"])
    return out


def _random_packed(kind, n: int, k: int, gen: torch.Generator):
    """Random codes and scales in the packed layout (no quantizer run: only the kernels' speed is measured)."""
    from fuelpipe.quant.formats import PackedWeight, QuantKind

    scales = (0.01 * torch.rand(n, k // 32, generator=gen)).half()
    if kind is QuantKind.int8:
        return PackedWeight(kind, torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8), scales)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    return PackedWeight(kind, q, scales, (-0.08 * torch.rand(n, k // 32, generator=gen)).half())


def _read(file: Path, runnable: list[str], has_paths: bool):
    try:
        doc = json.loads(file.read_text())
        paths_ok = set(doc["best"]) == (set(MEASURED) if has_paths else set())
        if paths_ok and all(p in runnable for p in doc["best"].values()) and doc["f32_prefetch_bytes"] in PREFETCH_BYTES:
            return doc
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None  # absent, damaged or from before a choice was added: measured again


def _write(file: Path, doc: dict) -> None:
    tmp = file.with_name(f".{FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, file)
    except OSError as err:  # a read-only cache folder: the choice holds for this process only
        log.warning("could not store the kernel path choice in %s: %s", file, err)
