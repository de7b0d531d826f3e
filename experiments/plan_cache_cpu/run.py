"""Study: a persistent inductor plan across processes, SmolLM2-135M f32 (see README.md beside this file).

    python experiments/plan_cache_cpu/run.py [--cache DIR] [--out results.json]

Each build runs in its own Python process (``build`` below), as a sweep worker would:
1. cold: an empty plan cache and torch's own compile caches off (plan.cache_policy=cold);
2. hit: a second process, same plan: must load the first one's entry, logits bit-identical;
3. other weights: one weight scaled by 1.001 (same shapes): must miss;
4. other geometry: KV capacity 512 instead of 256: must miss;
5. two processes building one new key (capacity 384) at the same time: one entry, both correct.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from fuelpipe.machine import cpu_name  # noqa: E402


def build(cache_dir: str, capacity: int, scale_weight: bool, policy: str, logits_out: str) -> dict:
    import torch

    torch.set_num_threads(2)
    from fuelpipe.context import InferenceContext
    from fuelpipe.plan.backends import BackendSpec
    from fuelpipe.plan.plan_store import PlanCacheSpec
    from fuelpipe.weights import load_named

    model = load_named("smollm2_135m", dtype=torch.float32, device=torch.device("cpu"))[0]
    if scale_weight:
        with torch.no_grad():
            next(iter(model.parameters())).mul_(1.001)
    spec = BackendSpec(name="inductor", cache_policy=policy, plan_cache=PlanCacheSpec(dir=cache_dir))
    ctx = InferenceContext(model, spec)
    cache = ctx.new_cache(capacity)
    ctx.prefill(cache, [1, 9690, 2, 314, 1782])
    t0 = time.perf_counter()
    rows = [ctx.decode(cache, 28)]  # builds the plan (key, load or compile) and runs it
    build_s = time.perf_counter() - t0
    rows += [ctx.decode(cache, t) for t in (44, 253, 2115)]
    torch.save(torch.cat(rows), logits_out)
    return {"build_s": build_s, **ctx.plan.session.program.cache_event.record()}


def spawn(cache_dir: str, capacity: int, scale: bool, policy: str, logits: str) -> subprocess.Popen:
    args = [sys.executable, __file__, "--worker", cache_dir, str(capacity), str(int(scale)), policy, logits]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"worker failed with exit {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    import torch

    cache = args.cache or tempfile.mkdtemp(prefix="fuelpipe-plan-cache-")
    tmp = Path(tempfile.mkdtemp())
    runs = {}
    for name, capacity, scale, policy in [("cold", 256, False, "cold"), ("hit", 256, False, "warm"),
                                          ("other_weights", 256, True, "warm"), ("other_geometry", 512, False, "warm")]:
        runs[name] = result(spawn(cache, capacity, scale, policy, str(tmp / f"{name}.pt")))
        print(name, runs[name], flush=True)
    a, b = (spawn(cache, 384, False, "warm", str(tmp / f"writer{i}.pt")) for i in range(2))
    runs["writer_a"], runs["writer_b"] = result(a), result(b)
    print("writers", runs["writer_a"], runs["writer_b"], flush=True)
    lg = {n: torch.load(tmp / f"{n}.pt") for n in ("cold", "hit", "other_weights", "writer0", "writer1")}
    entries = [p for p in (Path(cache) / "v1").iterdir() if not p.name.startswith(".")]
    record = {
        "runs": runs,
        "hit_over_cold": runs["hit"]["build_s"] / runs["cold"]["build_s"],
        "hit_logits_bit_identical": torch.equal(lg["cold"], lg["hit"]),
        "other_weights_missed": runs["other_weights"]["status"] == "miss",
        "other_weights_logits_differ": not torch.equal(lg["cold"], lg["other_weights"]),
        "other_geometry_missed": runs["other_geometry"]["status"] == "miss",
        "writers_same_key": runs["writer_a"]["key"] == runs["writer_b"]["key"],
        "writers_published": [runs["writer_a"]["published"], runs["writer_b"]["published"]],
        "writers_logits_equal": torch.equal(lg["writer0"], lg["writer1"]),
        "entries_after": len(entries),
        "entry_dirs_for_writer_key": sum(p.name == runs["writer_a"]["key"] for p in entries),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "load_avg": os.getloadavg(),
        "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                 cwd=HERE).stdout.strip(),
    }
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        d, cap, scale, policy, logits = sys.argv[2:7]
        print(json.dumps(build(d, int(cap), bool(int(scale)), policy, logits)))
    else:
        main()
