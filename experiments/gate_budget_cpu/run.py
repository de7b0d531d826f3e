"""The gate at a user's pace: `experiment=parity` wall time and peak RSS per model, each oracle's cost.

    python experiments/gate_budget_cpu/run.py                 # every model below, in turn
    python experiments/gate_budget_cpu/run.py gemma3_270m     # some of them

Each model runs `python -m fuelpipe model=<m> experiment=parity` in a fresh process (as a user would,
C++ kernels already built), timed from start to exit. Peak RSS is the largest phase peak results.json
records (load, generation, and each oracle's own). Writes results.json beside this file (merging
models already recorded) and prints the table the README shows.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# model -> budget in seconds (issue 38: Gemma 3 270M 5 min and 2 GB, SmolLM2 3 min, every tiny family 2 min)
BUDGET_S = {"gemma3_270m": 300, "smollm2_135m": 180, "llama_tiny": 120, "phi_tiny": 120, "qwen3_tiny": 120,
            "gemma3_tiny": 120, "deepseek_v2_tiny": 120}
BUDGET_MB = {"gemma3_270m": 2048}
EXTRA = {"deepseek_v2_tiny": ["kv=latent"]}  # MLA decodes from its latent cache


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def measure(model: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fuelpipe", f"model={model}", "experiment=parity",
                               *EXTRA.get(model, []), f"hydra.run.dir={out}"], cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, CI="true"))
        wall = time.perf_counter() - t0
        doc = json.loads((Path(out) / "results.json").read_text())
    if "memory" not in doc:
        raise SystemExit(f"{model}: exit {proc.returncode}, status {doc['status']}: {doc.get('reasons')}\n"
                         f"{proc.stderr[-3000:]}")
    phases = doc["memory"]["phases"]
    peaks = {k: v["peak_mb"] for k, v in phases.items() if "peak_mb" in v}
    oracles = [{"name": o["name"], "verdict": "SKIP" if o.get("skipped") else ("PASS" if o["passed"] else "FAIL"),
                "seconds": round(o["seconds"], 1), "builds": o.get("builds"), "peak_rss_mb": o.get("peak_rss_mb"),
                "on": o.get("setup", {}).get("model", "the model")} for o in doc["oracles"]]
    return {"model": model, "overrides": EXTRA.get(model, []), "exit": proc.returncode, "status": doc["status"], "wall_s": round(wall, 1),
            "peak_rss_mb": round(max(peaks.values()), 0), "peak_phase": max(peaks, key=peaks.get),
            "budget_s": BUDGET_S.get(model), "budget_mb": BUDGET_MB.get(model), "oracles": oracles,
            "load_s": (doc.get("load") or {}).get("load_s")}


def main(models: list[str]) -> None:
    path = HERE / "results.json"
    record = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    for model in models:
        run = measure(model)
        record["runs"][model] = run
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{model}: exit {run['exit']} {run['status']} {run['wall_s']} s (budget {run['budget_s']} s), "
              f"peak {run['peak_rss_mb']:.0f} MB in {run['peak_phase']}", flush=True)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    record["machine"] = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                         "commit": commit, "load_avg_at_end": os.getloadavg()}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("| model | wall s | budget s | peak RSS MB | status |\n|---|---|---|---|---|")
    for model, run in record["runs"].items():
        budget_mb = f" (budget {run['budget_mb']})" if run.get("budget_mb") else ""
        print(f"| {model} | {run['wall_s']} | {run['budget_s']} | {run['peak_rss_mb']:.0f}{budget_mb} | "
              f"{run['status']} |")


if __name__ == "__main__":
    main(sys.argv[1:] or list(BUDGET_S))
