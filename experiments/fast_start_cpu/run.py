"""How fast does each backend start, cold and warm, and what does it decode at? SmolLM2-135M, 2 threads.

    python experiments/fast_start_cpu/run.py            # writes results.json beside this file
    python experiments/fast_start_cpu/run.py results_intel_amx.json   # or the file named (another CPU kind)

Part 1, the CLI as a user runs it: ``python -m fuelpipe experiment=generate`` (a 32-token greedy reply) for
fx, inductor, aot (the default) and aot with int8 weights, each twice in fresh processes: **cold** (an
empty plan cache folder, and empty torch compile caches) and **warm** (the same folders again). Recorded
from results.json: the first token after the weights are loaded (the prompt step), the decode plan's build
(the first decode step), steady decode ms/token, and the process's wall time.

Part 2, side by side in one process (the ratios are the point: this machine is shared): the decode plans
of fx, aot as built by default (one program per distinct layer shape, weights as arguments) and aot
compiled as one whole-step package (the former build), each timed in 8 interleaved rounds of 8 tokens.

Part 3, the peer: llama.cpp (llama-cpp-python) loading the same GGUF file (Q4_1) and producing its first
token, when it is installed.
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
ROOT = HERE.parents[1]
PROMPT = "Explain in two sentences why the sky is blue."
CASES = {
    "fx": ["backend=fx"],
    "inductor": ["backend=inductor"],
    "aot (default)": [],
    "aot int8": ["weights.dtype=int8"],
}


def cli_run(overrides: list[str], cache: str, inductor_cache: str, out: str) -> dict:
    env = dict(os.environ, CI="true", FUELPIPE_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fuelpipe", "experiment=generate", f"prompt={PROMPT!r}",
                           "max_new_tokens=32", "backend.threads=2", f"hydra.run.dir={out}", *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stdout[-2000:] + proc.stderr[-2000:], "wall_s": wall}
    doc = json.loads(Path(out, "results.json").read_text())
    g = doc["generation"]
    return {"wall_s": round(wall, 2), "load_s": doc["load"]["load_s"] if doc.get("load") else None,
            "first_token_ms": round(g["prefill_ms"], 1), "plan_build_ms": round(1000 * g["plan_build_s"], 1),
            "first_decode_ms": round(g["first_decode_ms"], 1), "ms_per_token": round(g["ms_per_token"], 2),
            "plan_cache": g.get("plan_cache"), "text": g["text"][:80]}


def part1() -> dict:
    rows = {}
    for name, overrides in CASES.items():
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as ind:
            cold = cli_run(overrides, cache, ind, tempfile.mkdtemp())
            warm = cli_run(overrides, cache, ind, tempfile.mkdtemp())
        rows[name] = {"cold": cold, "warm": warm}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


SIDE = r"""
import json, sys, time, statistics, torch
torch.set_num_threads(2)
from fuelpipe.api.text_model import _resolve
from fuelpipe.context import InferenceContext
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.weights.loader import load_model
model, _, _ = load_model(_resolve("smollm2_135m"), dtype=torch.float32)
out, held = {}, {}
for name in ("fx", "aot", "aot whole step"):
    ctx = InferenceContext(model, BackendSpec(name="fx" if name == "fx" else "aot"))
    cache = ctx.new_cache(256)
    ctx.prefill(cache, [1, 2, 3, 4, 5])
    import fuelpipe.plan.aot_program as ap
    from fuelpipe.plan.layer_segments import NotSegmentable
    layered = ap.AotStep._realize_layered
    if name == "aot whole step":  # the plan is built on the first decode: the former build, one package
        def whole(self, gm, args):
            raise NotSegmentable("the study's whole-step arm")
        ap.AotStep._realize_layered = whole
    t = time.perf_counter()
    ctx.decode(cache, 6)
    build = time.perf_counter() - t
    ap.AotStep._realize_layered = layered
    ev = ctx.plan.session.program.cache_event
    out[name] = {"build_s": round(build, 2), "event": ev.record() if ev else None, "ms": []}
    held[name] = (ctx, cache)
for r in range(8):
    for name, (ctx, cache) in held.items():
        for i in range(8):
            t = time.perf_counter(); ctx.decode(cache, 7 + i + 8 * r); out[name]["ms"].append(1000 * (time.perf_counter() - t))
for name in out:
    out[name]["median_ms"] = round(statistics.median(out[name].pop("ms")), 2)
print(json.dumps(out))
"""


def part2() -> dict:
    with tempfile.TemporaryDirectory() as ind:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=ind)
        proc = subprocess.run([sys.executable, "-c", SIDE], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    best = min(v["median_ms"] for v in doc.values())
    for v in doc.values():
        v["vs_fastest"] = round(v["median_ms"] / best, 3)
    print("side by side", json.dumps(doc), flush=True)
    return doc


PEER = r"""
import json, sys, time
t = time.perf_counter()
from llama_cpp import Llama
from fuelpipe.weights.named import named_path
llm = Llama(model_path=str(named_path("smollm2_135m")), n_threads=2, n_ctx=512, verbose=False)
loaded = time.perf_counter()
llm.create_completion(sys.argv[1], max_tokens=1, temperature=0)
done = time.perf_counter()
print(json.dumps({"load_s": round(loaded - t, 3), "first_token_ms": round(1000 * (done - loaded), 1),
                  "load_and_first_token_s": round(done - t, 3)}))
"""


def part3() -> dict:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed"}
    proc = subprocess.run([sys.executable, "-c", PEER, PROMPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["file"] = "SmolLM2-135M-Instruct.Q4_1.gguf (llama.cpp decodes it in Q4_1; fuelpipe dequantizes it to f32)"
    print("llama.cpp", json.dumps(doc), flush=True)
    return doc


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    flags = Path("/proc/cpuinfo").read_text()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f" {f}" in flags]
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    import torch

    doc = {"cpu": cpu(), "isa": isa, "cores": os.cpu_count(), "torch": torch.__version__, "commit": commit,
           "cli": part1(), "side_by_side": part2(), "llama_cpp": part3(), "load_avg_end": os.getloadavg()}
    out = HERE / (sys.argv[1] if len(sys.argv) > 1 else "results.json")
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
