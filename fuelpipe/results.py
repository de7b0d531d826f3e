"""results.json: one document per run, its schema, and the environment it records.

The schema is documented in docs/results_schema.md; ``schema_problems``
checks a document against it and is what the tests and the report use, so
the documentation, the writer and the readers agree on one definition.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional

import torch

import fuelpipe

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"

OK, FAILED, SKIPPED, CONFIG_ERROR, ERROR = "ok", "failed", "skipped", "config_error", "error"
UNCAUGHT = "uncaught"  # a negative control ran and its oracle still passed: the oracle cannot fail there
# A sweep job whose process died (a signal: a native crash, the OOM killer; or its worker was lost):
# recorded by the process that watched it (fuelpipe.runner.isolated), with the signal in ``crash``.
CRASHED = "crashed"
INTERRUPTED = "interrupted"  # stopped by SIGINT (Ctrl-C): what ran before is recorded, the rest did not run
STATUSES = (OK, FAILED, SKIPPED, CONFIG_ERROR, ERROR, UNCAUGHT, CRASHED, INTERRUPTED)
# The CI contract: 1 is a verdict (an oracle failed, a sweep's job crashed), 2 bad input, 3 a crash of
# fuelpipe itself (a Python exception), 130 stopped by Ctrl-C (the shell's 128 + SIGINT).
EXIT_CODES = {OK: 0, FAILED: 1, CRASHED: 1, CONFIG_ERROR: 2, ERROR: 3, UNCAUGHT: 4, INTERRUPTED: 130}
INTERNAL_ERROR_EXIT = EXIT_CODES[ERROR]

# Top-level keys and their JSON types (None: JSON null allowed).
TOP_LEVEL = {
    "schema_version": (int,),
    "passed": (bool,),
    "status": (str,),
    "reasons": (list,),
    "experiment": (str,),
    "negative_control": (bool,),
    "oracles": (list,),
    "bench": (dict, type(None)),
    "config": (dict,),
    "overrides": (list,),
    "choices": (dict,),
    "env": (dict,),
}
ORACLE_KEYS = {
    "name": (str,),
    "passed": (bool,),
    "metric": (dict,),
    "tolerance": (float, int, type(None)),
    "detail": (str,),
    "negative_control": (bool,),
    "fault": (str,),
    "seconds": (float, int),
    "setup": (dict,),
    "skipped": (bool,),
}
ORACLE_OPTIONAL_KEYS = {  # written since the gate reports each oracle's cost; older documents lack them
    "builds": (int,),
    "build_s": (float, int),
    "peak_rss_mb": (float, int),  # the process's peak resident set while the oracle ran (a runner's job)
}
BENCH_KEYS = {
    "plan_mode": (str,),
    "decode_ms_per_token": (float, int),
    "decode_ms_p90": (float, int),
    "prefill_ms": (float, int),
    "plan_build_ms": (float, int),
    "plan_builds": (int,),
    "tokens": (int,),
    "warmup": (int,),
    "tokens_per_s": (float, int),
    "peak_rss_mb": (float, int),
    "kv_bytes": (int,),
    "plan_once_ms_per_token": (float, int, type(None)),
    "replan_ms_per_token": (float, int, type(None)),
    "replan_over_plan_once": (float, int, type(None)),
    "cache_policy": (str,),
}
ERROR_KEYS = ("type", "message", "traceback")  # the ``error`` object of a job that raised
CRASH_KEYS = {"signal": (str, type(None)), "exit_code": (int, type(None)), "detail": (str,)}  # ``crash``
ENV_KEYS = {
    "fuelpipe": (str,),
    "torch": (str,),
    "python": (str,),
    "platform": (str,),
    "device": (str,),
    "threads": (int,),
    "git": (str, type(None)),
}


def results_doc(
    status: str,
    *,
    config: dict[str, Any],
    env: dict[str, Any],
    oracles: list[dict[str, Any]] = (),
    bench: Optional[dict[str, Any]] = None,
    reasons: list[str] = (),
    overrides: list[str] = (),
    choices: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    exp = config.get("experiment", {})
    return {
        "schema_version": SCHEMA_VERSION,
        "passed": status == OK,
        "status": status,
        "reasons": list(reasons),
        "experiment": exp.get("name", ""),
        "negative_control": bool(exp.get("negative_control", False)),
        "oracles": list(oracles),
        "bench": bench,
        "config": config,
        "overrides": list(overrides),
        "choices": dict(choices or {}),
        "env": env,
    }


def status_of(oracles: list[dict[str, Any]]) -> str:
    """ok unless an oracle failed; a skipped oracle (it checked nothing, and says why) fails nothing.

    Under a negative control the oracle's fault is injected and it must fail: one that passes anyway
    makes the run ``uncaught`` (exit 4), whatever the other oracles did, so a toothless oracle
    cannot hide among working ones.
    """
    if uncaught_faults(oracles):
        return UNCAUGHT
    return OK if all(o["passed"] or o.get("skipped", False) for o in oracles) else FAILED


def uncaught_faults(oracles: list[dict[str, Any]]) -> list[str]:
    """A reason per oracle that passed with its fault injected."""
    return [f"oracle {o['name']} did not catch its injected fault {o.get('fault')!r}: its negative control passed"
            for o in oracles if o.get("negative_control") and o["passed"] and not o.get("skipped", False)]


def env_info(device: str, threads: int) -> dict[str, Any]:
    return {
        "fuelpipe": fuelpipe.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "threads": threads,
        "git": git_hash(),
    }


def git_hash() -> Optional[str]:
    """The checkout's commit (with "-dirty" when the tree has changes), or None outside git."""
    root = Path(fuelpipe.__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def write_results(out_dir: Path, doc: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    tmp = path.with_name(f".{RESULTS_FILE}.{os.getpid()}.tmp")  # per process: a watcher and its job never share one
    try:
        tmp.write_text(json.dumps(_json_safe(doc), indent=2, allow_nan=False) + "\n")
        os.replace(tmp, path)  # a reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)  # interrupted before the rename: no stray half file
    return path


def read_results(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def schema_problems(doc: Any) -> list[str]:
    """Every way ``doc`` departs from the documented schema (empty: it conforms)."""
    if not isinstance(doc, dict):
        return [f"document must be an object, got {type(doc).__name__}"]
    problems = _check(doc, TOP_LEVEL, "")
    if doc.get("status") not in STATUSES:
        problems.append(f"status must be one of {list(STATUSES)}, got {doc.get('status')!r}")
    if isinstance(doc.get("passed"), bool) and doc["passed"] != (doc.get("status") == OK):
        problems.append(f"passed={doc['passed']} contradicts status={doc.get('status')!r}")
    for i, oracle in enumerate(doc.get("oracles") or []):
        problems += _check(oracle, ORACLE_KEYS, f"oracles[{i}].") if isinstance(oracle, dict) else [
            f"oracles[{i}] must be an object"
        ]
        if isinstance(oracle, dict):
            present = {k: v for k, v in ORACLE_OPTIONAL_KEYS.items() if k in oracle}
            problems += _check(oracle, present, f"oracles[{i}].")
        if isinstance(oracle, dict) and oracle.get("skipped") is True and oracle.get("passed") is True:
            problems.append(f"oracles[{i}]: skipped and passed contradict each other")
    if isinstance(doc.get("bench"), dict):
        problems += _check(doc["bench"], BENCH_KEYS, "bench.")
    if isinstance(doc.get("env"), dict):
        problems += _check(doc["env"], ENV_KEYS, "env.")
    if doc.get("status") == CRASHED:
        crash = doc.get("crash")
        problems += _check(crash, CRASH_KEYS, "crash.") if isinstance(crash, dict) else [
            "status 'crashed' needs a crash object (signal, exit_code, detail)"]
    if doc.get("status") in (SKIPPED, CONFIG_ERROR, ERROR, CRASHED, INTERRUPTED) and not doc.get("reasons"):
        problems.append(f"status {doc.get('status')!r} needs at least one entry in reasons")
    if doc.get("status") == ERROR:
        error = doc.get("error")
        if not isinstance(error, dict) or not all(isinstance(error.get(k), str) for k in ERROR_KEYS):
            problems.append(f"status 'error' needs an error object with string {', '.join(ERROR_KEYS)}")
    return problems


def _check(obj: dict, spec: dict[str, tuple], prefix: str) -> list[str]:
    out = []
    for key, types in spec.items():
        if key not in obj:
            out.append(f"{prefix}{key} is missing")
        elif not isinstance(obj[key], types) or (isinstance(obj[key], bool) and bool not in types):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            out.append(f"{prefix}{key} must be {names}, got {type(obj[key]).__name__}")
    return out


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/Infinity: write non-finite floats as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
