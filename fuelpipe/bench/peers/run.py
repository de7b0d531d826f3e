"""Run the peers benchmark: every system, the same prompt, interleaved repetitions, one process.

Repetition 0 is a warm-up for every system (plans are built and code is
compiled there; its first-token latency is reported as the cold start).
Repetitions 1..N are timed. The order of systems rotates every repetition, so
clock or thermal drift hits all of them alike. A system's greedy tokens are
compared with the reference system's (transformers dynamic, when present):
a row whose tokens differ is reported but does not count as a speed result.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import psutil

from fuelpipe.bench.decode import percentile
from fuelpipe.bench.peers.floor import Floor
from fuelpipe.bench.peers.isolated import PeerCrashed
from fuelpipe.bench.peers.systems import PeerSystem
from fuelpipe.bench.peers.trace import RunTrace
from fuelpipe.resident_memory import MB, peak_mb, reset_peak


@dataclass
class SystemRecord:
    system: PeerSystem
    footprint_mb: float = 0.0
    warmup_run_s: float = 0.0  # the first generation's wall time: plan builds and compiles land here
    cold: Optional[RunTrace] = None
    timed: list[RunTrace] = field(default_factory=list)
    crashed: Optional[str] = None  # the system's worker died (or failed): why, and when
    details: dict = field(default_factory=dict)  # the system's own build / compile costs
    peak_mb: dict = field(default_factory=dict)  # per phase (load, build, decode): the peak resident set, MB

    @property
    def steps(self) -> list[float]:
        return [ms for t in self.timed for ms in t.step_ms]


def run_systems(
    systems: list[PeerSystem],
    prompt: list[int],
    new_tokens: int,
    reps: int,
    on_progress: Optional[Callable[[str], None]] = None,
) -> list[SystemRecord]:
    proc = psutil.Process()
    records = []
    try:
        for s in systems:
            rec = SystemRecord(s)
            records.append(rec)
            if s.missing:
                continue
            before = proc.memory_info().rss
            t0 = time.perf_counter()
            try:
                _phase(rec, "load", s.setup)
                t0 = time.perf_counter()
                rec.cold = _phase(rec, "build", lambda: s.run(prompt, _tokens_for(s, new_tokens)))
            except PeerCrashed as err:
                rec.crashed = f"{err} (warm-up)"
                continue
            rec.warmup_run_s = time.perf_counter() - t0
            own = getattr(s, "worker_footprint_mb", None)  # an isolated peer's growth is its worker's
            rec.footprint_mb = own if own is not None else (proc.memory_info().rss - before) / MB
            if on_progress:
                on_progress(f"warm-up {s.name}")
        live = [r for r in records if not r.system.missing and r.crashed is None]
        for rep in range(reps):
            shift = rep % max(1, len(live))
            for rec in live[shift:] + live[:shift]:
                if rec.crashed is not None:
                    continue
                try:
                    rec.timed.append(_phase(rec, "decode", lambda: rec.system.run(prompt, _tokens_for(rec.system,
                                                                                                        new_tokens))))
                except PeerCrashed as err:
                    rec.crashed = f"{err} (repetition {rep + 1})"
                if on_progress:
                    on_progress(f"rep {rep + 1}/{reps} {rec.system.name}")
        for rec in records:  # read while the workers live
            rec.details = rec.system.details() if rec.crashed is None and not rec.system.missing else {}
    finally:
        for s in systems:
            if hasattr(s, "close"):
                s.close()
    return records


def _phase(rec: SystemRecord, name: str, fn):
    """Run ``fn`` and keep the highest peak resident set seen in phase ``name``: the worker's for an isolated
    peer, this process's otherwise (its peak reset first, where the OS allows)."""
    reset_peak()
    out = fn()
    own = getattr(rec.system, "last_peak_mb", None)
    rec.peak_mb[name] = max(rec.peak_mb.get(name, 0.0), own if own is not None else peak_mb())
    return out


def _tokens_for(s: PeerSystem, new_tokens: int) -> int:
    return min(new_tokens, s.max_new_tokens) if s.max_new_tokens else new_tokens


def summarize(records: list[SystemRecord], floor: Floor, reference: Optional[str]) -> list[dict]:
    """One row per system: timings, bandwidth, ratios, token agreement, costs."""
    ref_tokens = None
    by_name = {r.system.name: r for r in records}
    if reference in by_name and by_name[reference].timed:
        ref_tokens = by_name[reference].timed[0].tokens
    rows = []
    for rec in records:
        s = rec.system
        row: dict = {"system": s.name, "group": s.group, "weights": s.weights}
        if s.missing or rec.crashed:
            row["status"] = s.missing or rec.crashed
            rows.append(row)
            continue
        steps = rec.steps
        med = statistics.median(steps)
        rep_medians = [statistics.median(t.step_ms) for t in rec.timed]
        tokens = rec.timed[0].tokens
        same_every_rep = all(t.tokens == tokens for t in rec.timed)
        agree = None if ref_tokens is None else _agreeing_prefix(tokens, ref_tokens)
        # The floor counts the model's own bytes: it applies to rows running that arithmetic only.
        on_floor = s.weights == floor.weights
        row.update(
            status="ok",
            new_tokens=len(tokens),
            timed_steps=len(steps),
            ms_per_token=med,
            p10_ms=percentile(steps, 10),
            p90_ms=percentile(steps, 90),
            rep_medians_ms=rep_medians,
            tokens_per_s=1000.0 / med,
            achieved_gb_s=floor.bytes_per_token / (med / 1000.0) / 1e9 if on_floor else None,
            over_floor=med / floor.ms_per_token if on_floor else None,
            first_token_ms=statistics.median(t.first_token_ms for t in rec.timed),
            warmup_run_s=rec.warmup_run_s,
            footprint_mb=rec.footprint_mb,
            peak_rss_mb=dict(rec.peak_mb),  # per phase: load (setup), build (warm-up run), decode (timed runs)
            tokens_match_reference=None if agree is None else agree == len(tokens),
            tokens_agreeing=agree,
            deterministic=same_every_rep,
            **rec.details,
        )
        rows.append(row)
    return rows


def _agreeing_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def add_ratios(rows: list[dict], peers: list[str]) -> None:
    """``vs <peer>``: the peer's ms/token over this row's (above 1: this row is faster).

    ``verdict <peer>``: ``faster`` / ``slower`` only when the two rows' per-repetition medians do
    not overlap; otherwise ``level`` (the difference is inside run-to-run spread).
    """
    by = {r["system"]: r for r in rows if r.get("status") == "ok"}
    for r in by.values():
        r["vs"] = {p: by[p]["ms_per_token"] / r["ms_per_token"] for p in peers if p in by}
        r["verdict"] = {p: compare(r["rep_medians_ms"], by[p]["rep_medians_ms"]) for p in peers if p in by}


def compare(mine: list[float], theirs: list[float]) -> str:
    """faster | slower | level, from the spread of per-repetition medians."""
    if max(mine) < min(theirs):
        return "faster"
    if min(mine) > max(theirs):
        return "slower"
    return "level"
