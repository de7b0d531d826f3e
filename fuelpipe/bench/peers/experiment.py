"""``experiment=bench_peers``: assemble the systems from the config, time them, write the table and chart.

The fuelpipe rows are every configured backend x plan mode x KV layout on the
assembled model. The transformers and llama.cpp rows need the checkpoint as a
GGUF file (``model.weights=shipped`` or ``gguf``); with random weights they
are reported as unavailable, never silently dropped.
"""
from __future__ import annotations

import dataclasses
import itertools
import functools
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from omegaconf import DictConfig

from fuelpipe.bench.peers.isolated import IsolatedSystem
from fuelpipe.bench.peers.floor import decode_floor, measure_in_subprocess
from fuelpipe.bench.peers.plan_bits import plan_bits
from fuelpipe.bench.peers.report import bar_chart, markdown
from fuelpipe.bench.peers.run import add_ratios, run_systems, summarize
from fuelpipe.bench.peers.systems import FuelpipeSystem, LlamaCppSystem, PeerSystem, TransformersSystem
from fuelpipe.config.schema import Weights
from fuelpipe.errors import ConfigError
from fuelpipe.kv.spec import KvSpec
from fuelpipe.machine import cpu_name, speed_extensions
from fuelpipe.plan.panels import kernels_available
from fuelpipe.results import git_hash

REFERENCE = "transformers dynamic"


def checkpoint_gguf(m: DictConfig) -> Optional[Path]:
    if m.weights is Weights.shipped:
        from fuelpipe.weights.named import named_path

        return named_path(m.size)
    if m.weights is Weights.gguf:
        return Path(m.path)
    return None


def build_systems(cfg: DictConfig, asm) -> list[PeerSystem]:
    p = cfg.experiment.peers
    systems: list[PeerSystem] = []
    block = cfg.kv.block_size or 16
    for layout in p.kv_layouts:
        kv = KvSpec(layout=layout, block_size=block)
        for backend in p.backends:
            for plan in p.plans:
                cap = p.replan_new_tokens.get(backend) if plan == "replan" else None
                spec = dataclasses.replace(asm.setup.backend, name=backend)  # the configured passes and cache policy
                systems.append(FuelpipeSystem(asm.model, spec, plan, kv, max_new_tokens=cap))
                for ahead in p.f32_prefetch:  # the same row with the f32 kernel's prefetch forced
                    s = FuelpipeSystem(asm.model, spec, plan, kv, max_new_tokens=cap, f32_prefetch=ahead)
                    s.name += f" prefetch={ahead}"
                    why = kernels_available()  # None where the kernels run
                    if why is not None:
                        s.missing = f"no f32 kernel prefetch to force: fuelpipe's C++ kernels could not be built ({why})"
                    systems.append(s)
    systems += quantized_systems(cfg, asm)
    path = checkpoint_gguf(cfg.model)
    threads = torch.get_num_threads()
    no_gguf = "needs the checkpoint as a GGUF file (model.weights=shipped or gguf)"
    shared: dict = {}  # in-process transformers modes share one loaded model
    for mode in p.transformers:
        s = _peer(p, functools.partial(TransformersSystem, path or Path("."), mode, {} if p.isolate else shared),
                  threads)
        if path is None:
            s.missing = no_gguf
        systems.append(s)
    if p.llama_cpp:
        n_ctx = p.prompt_tokens + p.new_tokens + 8
        f32_path = q8_path = None
        if path is not None and LlamaCppSystem(None, "", "", threads, n_ctx).missing is None:
            from fuelpipe.bench.peers.f32_gguf import f32_gguf_path, q8_0_gguf_path
            from fuelpipe.weights.named import cache_dir

            f32_path = f32_gguf_path(path, cache_dir())
            q8_path = q8_0_gguf_path(f32_path)
        rows = [(f32_path, "F32", "f32"), (path, f"{_file_type(path)} (original file)", _file_type(path).lower())]
        if p.quantized:
            rows.append((q8_path, "Q8_0 (from the F32 file)", "q8_0"))
        for file, label, weights in rows:
            s = _peer(p, functools.partial(LlamaCppSystem, file, label, weights, threads, n_ctx), threads)
            if path is None and not s.missing:
                s.missing = no_gguf
            systems.append(s)
    return systems


def _peer(p, make, threads: int) -> PeerSystem:
    """A peer system: in its own worker process (``experiment.peers.isolate``), or in this one."""
    return IsolatedSystem(make, threads) if p.isolate else make()


def _file_type(path: Optional[Path]) -> str:
    """The GGUF's dominant matrix type (Q4_1 for the shipped SmolLM2), for the original-file row's name."""
    if path is None:
        return "original"
    from collections import Counter

    from fuelpipe.weights.gguf_file import GgufFile

    f = GgufFile(path)
    kinds = Counter(t.type_name for t in f.tensors.values() if len(t.shape) == 2)
    return kinds.most_common(1)[0][0] if kinds else "original"


def quantized_systems(cfg: DictConfig, asm) -> list[PeerSystem]:
    """fuelpipe rows on the same checkpoint packed at load, one model per kind (see PeersConfig.quantized),
    each on every kernel vector path of ``vector_paths`` (see PeersConfig.vector_paths)."""
    from fuelpipe.kernels.build import vector_paths
    from fuelpipe.quant.formats import QuantKind, QuantSpec
    from fuelpipe.runner.assemble import build_model

    p = cfg.experiment.peers
    out: list[PeerSystem] = []
    kv = KvSpec(layout="contiguous", block_size=cfg.kv.block_size or 16)
    for entry in p.quantized:
        kind, _, activations = entry.partition(":")
        default = cfg.weights.activations.value if kind in ("int8", "int4") else "auto"
        spec = QuantSpec(QuantKind(kind), int(cfg.weights.group_size), activations or default)
        model = build_model(cfg.model, asm.device, seed=cfg.model.seed, quant=spec)
        for backend, path in itertools.product(p.quantized_backends, list(p.vector_paths) or [None]):
            s = FuelpipeSystem(model, dataclasses.replace(asm.setup.backend, name=backend), "plan_once", kv,
                               vector_path=path)
            s.name, s.weights = f"{s.name} {spec.label()}" + (f" @{path}" if path else ""), spec.label()
            if path and path not in vector_paths():
                s.missing = f"this CPU or build has no {path} path (it runs {', '.join(vector_paths())})"
            out.append(s)
    return out


def peer_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "llama-cpp-python"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def peak_rss_mb() -> float:
    """The process's peak resident set (every system ran in this process)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def peers_prompt(asm, n: int) -> list[int]:
    ids = list(asm.prompts[0])
    if len(ids) < n:
        raise ConfigError(
            f"experiment.peers.prompt_tokens={n} but the first prompt holds only {len(ids)} tokens; "
            "give a longer experiment.text_prompts[0] (or prompts[0])"
        )
    return ids[:n]


def run_peers(cfg: DictConfig, asm, on_progress: Optional[Callable[[str], None]] = None) -> dict:
    p = cfg.experiment.peers
    t0 = time.perf_counter()
    prompt = peers_prompt(asm, p.prompt_tokens)
    systems = build_systems(cfg, asm)
    threads = torch.get_num_threads()
    load_before = os.getloadavg()
    bandwidth = measure_in_subprocess(threads)
    floor = decode_floor(asm.model, p.prompt_tokens, p.new_tokens, bandwidth)
    records = run_systems(systems, prompt, p.new_tokens, p.reps, on_progress)
    load_after = os.getloadavg()
    bandwidth_after = measure_in_subprocess(threads)  # drift check: the floor uses the better of the two
    bandwidth_before = bandwidth.gb_s
    if bandwidth_after.gb_s > bandwidth.gb_s:
        bandwidth = bandwidth_after
        floor = decode_floor(asm.model, p.prompt_tokens, p.new_tokens, bandwidth)
    names = {s.name for s in systems}
    rows = summarize(records, floor, REFERENCE if REFERENCE in names else None)
    peers = [s.name for s in systems if s.group != "fuelpipe" and not s.missing]
    add_ratios(rows, peers)
    _replan_ratios(rows)
    # untimed, after every timed run: each plan_once row against its replan twin, bit for bit, over the
    # decode steps the replan row itself ran (its first new token comes from the prompt)
    def replan_steps(backend: str) -> int:
        return max(1, min(p.new_tokens, p.replan_new_tokens.get(backend, p.new_tokens)) - 1)

    bits = plan_bits(systems, prompt, replan_steps)
    for r in rows:
        if r["system"] in bits:
            r["plan_once_vs_replan"] = bits[r["system"]]
    doc = {
        "model": cfg.model.size,
        "dtype": cfg.model.dtype.value,
        "prompt_tokens": p.prompt_tokens,
        "new_tokens": p.new_tokens,
        "reps": p.reps,
        "prompt_ids": prompt,
        "reference": REFERENCE if REFERENCE in names else None,
        "peers": peers,
        "env": {"threads": threads, "cpu": cpu_name(), "cpu_extensions": speed_extensions(),
                "peers_isolated": bool(p.isolate), "torch": torch.__version__, "peak_rss_mb": peak_rss_mb(),
                "versions": peer_versions(), "git": git_hash(), "fx_passes": list(asm.setup.backend.fx_passes),
                "load_avg_1m_before": load_before[0], "load_avg_1m_after": load_after[0],
                "bandwidth_gb_s_before_after": [bandwidth_before, bandwidth_after.gb_s]},
        "floor": {
            "bytes_per_token": floor.bytes_per_token,
            "weight_bytes": floor.weight_bytes,
            "kv_bytes": floor.kv_bytes,
            "bandwidth_gb_s": floor.bandwidth.gb_s,
            "bandwidth_method": floor.bandwidth.method,
            "ms_per_token": floor.ms_per_token,
            "weights": floor.weights,
        },
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    doc["best_fuelpipe"] = best_fuelpipe(rows, peers)
    return doc


def _replan_ratios(rows: list[dict]) -> None:
    ms = {r["system"]: r.get("ms_per_token") for r in rows if r.get("status") == "ok"}
    for r in rows:
        if r.get("group") == "fuelpipe" and r.get("status") == "ok" and " plan_once " in r["system"]:
            replan = ms.get(r["system"].replace(" plan_once ", " replan "))
            r["replan_over_plan_once"] = replan / r["ms_per_token"] if replan else None


def best_fuelpipe(rows: list[dict], peers: list[str]) -> Optional[dict]:
    """The fastest fuelpipe plan_once row whose tokens match the reference, and how it compares.

    Verdicts name only peers computing the same function (their tokens match the reference);
    the others are listed apart, for reference.
    """
    ok = [r for r in rows if r.get("group") == "fuelpipe" and r.get("status") == "ok" and " plan_once " in r["system"]
          and r.get("tokens_match_reference") is not False
          and r.get("over_floor") is not None]  # the floor's arithmetic: quantized rows stand apart
    if not ok:
        return None
    best = min(ok, key=lambda r: r["ms_per_token"])
    same = {r["system"] for r in rows if r.get("status") == "ok" and r.get("tokens_match_reference") is not False}
    verdicts, other = [], []
    for peer, ratio in best.get("vs", {}).items():
        how = best["verdict"][peer]
        text = (f"{ratio:.2f}x faster than {peer}" if ratio >= 1 else f"{1 / ratio:.2f}x slower than {peer}")
        if how == "level":
            text += " (level: per-repetition medians overlap)"
        (verdicts if peer in same else other).append(text)
    return {"system": best["system"], "ms_per_token": best["ms_per_token"], "over_floor": best["over_floor"],
            "verdicts": verdicts, "other_arithmetic": other}


def write_outputs(doc: dict, out_dirs: list[Path]) -> list[str]:
    written = []
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "peers.md").write_text(markdown(doc))
        bar_chart(doc, d / "peers.png")
        written += [str(d / "peers.md"), str(d / "peers.png")]
    return written
