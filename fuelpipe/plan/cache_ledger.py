"""Every persistent plan-cache build of this process, by store folder: what a job reports as its plan cache.

A job's builds happen in many contexts (the generation, each oracle, the benchmark's arms), each with
its own ``PlanStats``; the benchmark's alone would show a hit where an oracle's build, earlier, found
the entry corrupt and rebuilt it. Each cached build records its event here once it is done
(``CachedAotStep``), and the job reads what happened between two marks for its configured folder.
A deliberate process-global record, appended to under a lock.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

REBUILT = ("corrupt", "mismatch")  # statuses where an entry was found, thrown out and compiled again

_lock = threading.Lock()
_events: list[tuple[str, dict[str, Any]]] = []  # (store folder, PlanCacheEvent.record())


def folder_key(store_dir: str | os.PathLike) -> str:
    return str(Path(store_dir).expanduser().resolve())


def record(store_dir: str | os.PathLike, event: dict[str, Any]) -> None:
    with _lock:
        _events.append((folder_key(store_dir), dict(event)))


def mark() -> int:
    """A position in the record: ``summary_since`` counts what came after it."""
    with _lock:
        return len(_events)


def summary_since(start: int, store_dir: str | os.PathLike) -> dict[str, Any]:
    """Builds against ``store_dir`` since ``start``: hits, compiles, statuses and what each rebuilt entry had wrong."""
    key = folder_key(store_dir)
    with _lock:
        events = [ev for folder, ev in _events[start:] if folder == key]
    statuses: dict[str, int] = {}
    for ev in events:
        statuses[ev["status"]] = statuses.get(ev["status"], 0) + 1
    hits = statuses.get("hit", 0)
    return {
        "dir": str(store_dir),
        "builds": len(events),
        "hits": hits,
        "misses": len(events) - hits,
        "statuses": statuses,
        "rebuilt": [f"{ev['status']}: {ev['detail']} (entry {ev['key']})" for ev in events if ev["status"] in REBUILT],
        "compile_ms": 1000.0 * sum(ev["compile_s"] for ev in events),
        "load_ms": 1000.0 * sum(ev["load_s"] for ev in events),
    }


def events_since(start: int) -> list[tuple[str, dict[str, Any]]]:
    """The (store folder, event) records after ``start``: what a worker process sends back to its parent,
    which ``record``s them, so a job's summary counts the builds its oracles made in workers too."""
    with _lock:
        return [(folder, dict(ev)) for folder, ev in _events[start:]]
