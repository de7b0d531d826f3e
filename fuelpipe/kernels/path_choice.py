"""Which vector path a kernel with several above AVX2 takes: the one measured fastest on this CPU.

A wider path is not always faster: on a 2-core Xeon with AVX-512 and AMX the 16-bit-activation int8 product
ran 1.32x faster on avx512 than on avx2 at one thread, and the 4-bit one 0.89x (experiments/vector_paths_cpu).
So each such kernel (``MEASURED``) is timed on every path this CPU runs, once per machine and build, on
eight distinct decoder layers of SmolLM2-135M's shapes (weights streamed from beyond the L2 cache, as in
decode) at one thread; the choice is stored beside the built library (``path_choice.json``, written atomically) and applied
at every load. A forced path (``$FUELPIPE_KERNEL_PATH``, ``forced_vector_path``) overrides it.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

MEASURED = ("q8_gemv_a16", "q4_gemv_a16")
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in): fused q/k/v, o, fused gate/up, down
LAYERS = 8  # distinct layers: 26 MB of int8 codes, beyond any L2
ROUNDS = 5
FILE = "path_choice.json"
log = logging.getLogger(__name__)


def apply(folder: Path) -> dict[str, str]:
    """Loads (or measures and stores) the choice for this build folder and hands it to the kernels."""
    ops = torch.ops.fuelpipe_kernels
    paths = [p for p in ops.vector_paths() if p not in ("scalar", "avx2")]
    if not paths:  # nothing above avx2: every kernel takes the chosen path
        return {}
    choice = _read(folder / FILE, ops.vector_paths())
    if choice is None:
        choice = measure(["avx2", *paths])
        _write(folder / FILE, choice)
    for kernel in MEASURED:
        ops.set_measured_path(kernel, choice["best"][kernel])
    return dict(choice["best"])


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
        for kernel, kind in zip(MEASURED, (QuantKind.int8, QuantKind.int4)):
            layers = [[_random_packed(kind, n, k, gen) for n, k in LAYER] for _ in range(LAYERS)]
            xs = [torch.randn(1, k, generator=gen) for _, k in LAYER]

            def layer() -> None:  # every layer once: weights stream from beyond the L2 cache, as in decode
                for packed in layers:
                    for p, x in zip(packed, xs):
                        if kind is QuantKind.int8:
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


def _read(file: Path, runnable: list[str]):
    try:
        doc = json.loads(file.read_text())
        if set(doc["best"]) == set(MEASURED) and all(p in runnable for p in doc["best"].values()):
            return doc
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None  # absent or damaged: measured again


def _write(file: Path, doc: dict) -> None:
    tmp = file.with_name(f".{FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, file)
    except OSError as err:  # a read-only cache folder: the choice holds for this process only
        log.warning("could not store the kernel path choice in %s: %s", file, err)
