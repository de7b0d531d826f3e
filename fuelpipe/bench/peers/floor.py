"""The memory-bandwidth floor of a decode step, measured on this machine in the same run.

A decode step must read every weight it multiplies by once (all layer
weights, the final norm and the output head; the embedding table only for
the one row it looks up) plus the KV it attends. At ``B`` bytes per second
no implementation can step faster than ``bytes / B``. ``B`` is the best of a
few streaming reads over a buffer much larger than the last-level cache, on
the threads the benchmark uses (the same threads every system gets).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Bandwidth:
    gb_s: float  # best observed read rate, 1e9 bytes/s
    method: str
    buffer_mb: float
    repeats: int


def measure_read_bandwidth(buffer_mb: float = 1024.0, repeats: int = 7) -> Bandwidth:
    """Best read rate over ``repeats`` passes of two read kernels (a sum and a dot product) on a large f32 buffer."""
    n = int(buffer_mb * 1e6) // 4
    x = torch.ones(n, dtype=torch.float32)  # touched, so every page is resident
    ones = torch.ones(n, dtype=torch.float32)
    best, how = 0.0, ""
    for _ in range(repeats):
        for name, fn, nbytes in (("sum", lambda: x.sum(), 4 * n), ("dot", lambda: torch.dot(x, ones), 8 * n)):
            t0 = time.perf_counter()
            fn()
            rate = nbytes / (time.perf_counter() - t0) / 1e9
            if rate > best:
                best, how = rate, name
    return Bandwidth(best, f"torch {how} over {buffer_mb:.0f} MB f32, {torch.get_num_threads()} threads", buffer_mb, repeats)


def measure_in_subprocess(threads: int, buffer_mb: float = 1024.0) -> Bandwidth:
    """``measure_read_bandwidth`` in a child process, so its 2 GB of buffers never count in this one's RSS."""
    code = (
        "import json, sys, torch; from dataclasses import asdict; "
        "from fuelpipe.bench.peers.floor import measure_read_bandwidth; "
        f"torch.set_num_threads({threads}); print(json.dumps(asdict(measure_read_bandwidth({buffer_mb}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return Bandwidth(**json.loads(out.stdout.strip().splitlines()[-1]))


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once, except the embedding table's unread rows.

    A tied head reads the embedding table in full (as the head), so it is counted once.
    """
    unique = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in unique)
    emb = model.embed_tokens.weight  # [vocab, hidden]: every family names its table so
    head = getattr(model, "lm_head", None)
    if head is None or head.weight is not emb:
        total -= (emb.shape[0] - 1) * emb.shape[1] * emb.element_size()  # only the looked-up row is read
    return total


def kv_bytes_read(n_layers: int, n_kv_heads: int, head_dim: int, positions: float, elem: int) -> float:
    """K and V bytes one step attends when ``positions`` are live."""
    return 2.0 * n_layers * n_kv_heads * head_dim * positions * elem


@dataclass(frozen=True)
class Floor:
    bytes_per_token: float  # weights + mean live KV over the timed steps
    weight_bytes: int
    kv_bytes: float
    bandwidth: Bandwidth
    weights: str = "f32"  # the arithmetic the byte count describes (rows running other weights are off the floor)

    @property
    def ms_per_token(self) -> float:
        return self.bytes_per_token / (self.bandwidth.gb_s * 1e9) * 1000.0


def decode_floor(model, prompt_len: int, new_tokens: int, bandwidth: Bandwidth) -> Floor:
    d = model.dims
    elem = next(model.parameters()).element_size()
    # Decode steps attend prompt_len+1 .. prompt_len+new_tokens-1 positions; their mean:
    mean_live = prompt_len + new_tokens / 2.0
    w = weight_bytes_per_token(model)
    kv = kv_bytes_read(d.n_layers, d.n_kv_heads, d.head_dim, mean_live, elem)
    name = {torch.float32: "f32", torch.bfloat16: "bf16"}.get(next(model.parameters()).dtype, "other")
    return Floor(w + kv, w, kv, bandwidth, name)
