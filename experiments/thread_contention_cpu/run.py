"""Decode beside other work: SmolLM2 chats in separate processes, adaptive threads against fixed counts.

    python experiments/thread_contention_cpu/run.py

Scenarios, each in fresh processes that load SmolLM2-135M (f32, fx), warm up, then start one 64-token
greedy chat together:
  alone          one process;
  pair           two processes decoding at once;
  busy neighbour one process beside a process that keeps every core busy with 2-thread torch matmuls.
Each scenario runs with the thread count left to fuelpipe (the ThreadGovernor) and fixed at 1 and at all
cores (``threads=N``). Reported: ms/token (the chat's wall time over its tokens, prompt included) of the
slower process, the median over ``ROUNDS`` (3) rounds that each run every case once, and its ratio to one
process alone with the count left to fuelpipe. Writes results.json beside this file and prints the table the README shows.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHAT = """
import json, os, sys, time
import fuelpipe
threads = None if sys.argv[3] == "auto" else int(sys.argv[3])
m = fuelpipe.load("smollm2_135m", threads=threads)
chat = [{"role": "user", "content": "Tell me a long story about a dragon who learns to cook."}]
m.chat(chat, max_new_tokens=4)
folder = sys.argv[1]
open(os.path.join(folder, str(os.getpid())), "w").close()
while len(os.listdir(folder)) < int(sys.argv[2]):
    time.sleep(0.005)
t = time.perf_counter()
out = m.chat(chat, max_new_tokens=64)
gov = m.context.thread_governor
print(json.dumps({"ms_per_token": 1000 * (time.perf_counter() - t) / len(out.tokens), "tokens": len(out.tokens),
                  "steps_at": None if gov is None else
                  {str(n): sum(1 for t, _, _ in gov.history if t == n) for n in gov.options}}))
"""

NEIGHBOUR = """
import os, sys, torch
torch.set_num_threads(int(sys.argv[2]))
a = torch.randn(512, 512)
open(os.path.join(sys.argv[1], "neighbour"), "w").close()
while True:
    a = torch.tanh(a @ a)
"""


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def scenario(processes: int, threads: str, neighbour: bool) -> list[dict]:
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as folder:
        waiters = processes + (1 if neighbour else 0)
        side = None
        if neighbour:
            side = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, folder, str(cores)])
        procs = [subprocess.Popen([sys.executable, "-c", CHAT, folder, str(waiters), threads],
                                  stdout=subprocess.PIPE, text=True) for _ in range(processes)]
        try:
            outs = [p.communicate(timeout=900)[0] for p in procs]
        finally:
            if side is not None:
                side.kill()
                side.wait()
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def main() -> None:
    import torch

    cores = len(os.sched_getaffinity(0))
    modes = ["auto", "1", str(cores)]
    rounds = int(os.environ.get("ROUNDS", "3"))
    cases = [(name, processes, neighbour, mode) for name, processes, neighbour in
             (("alone", 1, False), ("pair", 2, False), ("busy neighbour", 1, True)) for mode in modes]
    seen: dict[tuple, list] = {c: [] for c in cases}
    for i in range(rounds):  # every case once per round, so a slow spell of the machine hits them all
        for case in cases:
            runs = scenario(case[1], case[3], case[2])
            seen[case].append(runs)
            print(f"round {i} {case[0]:15s} threads={case[3]:4s} "
                  + " ".join(f"{r['ms_per_token']:.1f}" for r in runs), flush=True)
    rows = []
    for case, rounds_runs in seen.items():
        slowest = [max(r["ms_per_token"] for r in runs) for runs in rounds_runs]
        rows.append({"scenario": case[0], "threads": case[3], "rounds": rounds_runs,
                     "ms_per_token": statistics.median(slowest)})
    alone = {r["threads"]: r["ms_per_token"] for r in rows if r["scenario"] == "alone"}
    for r in rows:
        r["vs_alone_same_mode"] = r["ms_per_token"] / alone[r["threads"]]
        r["vs_alone_auto"] = r["ms_per_token"] / alone["auto"]
    doc = {"cpu": cpu_name(), "cores": cores, "torch": torch.__version__, "model": "smollm2_135m f32 fx",
           "tokens": 64, "rounds": rounds, "measured": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    (HERE / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{doc['cpu']}, {cores} cores: ms/token (the slower process, median of {rounds} rounds), "
          "and x one alone with threads=auto")
    print("| scenario | threads | ms/token | x alone (auto) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['threads']} | {r['ms_per_token']:.1f} | {r['vs_alone_auto']:.2f} |")


if __name__ == "__main__":
    main()
