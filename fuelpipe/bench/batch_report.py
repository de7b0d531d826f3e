"""``bench_batch``'s table (Markdown), CSV and plot (tokens/s against batch size, with the scaling floor)."""
from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = ("system", "batch", "status", "rows_equal", "tokens_per_s", "ms_per_token_per_request",
           "decode_tokens_per_s", "floor_tokens_per_s", "floor_bound", "of_floor", "over_best_transformers")


def _f(x, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(doc: dict) -> str:
    env, fl = doc["env"], doc["floor"]
    lines = [
        f"### bench_batch: {doc['model']} {doc['dtype']}, {doc['new_tokens']} new tokens per row, greedy, "
        f"{env['threads']} threads, {doc['reps']} timed pass(es) after a warm-up",
        "",
        f"CPU {env['cpu']}; torch {env['torch']}; transformers {env['versions'].get('transformers')}; "
        f"llama-cpp-python {env['versions'].get('llama-cpp-python')}; commit {env['git']}; "
        f"load (1 min) {env['load_avg_1m_before']:.2f} before, {env['load_avg_1m_after']:.2f} after. "
        f"Floor: {fl['bandwidth_gb_s']:.1f} GB/s read ({fl['bandwidth_method']}), "
        f"{fl['gemm_gflops']:.0f} GFLOP/s f32 GEMM.",
        "",
        "A row counts only when its tokens equal the system's own B = 1 tokens for that prompt; "
        "tokens/s is over the whole call (prefills included), counted rows only.",
        "",
        "| system | B | rows = B=1 | tokens/s | ms/token per request | decode tokens/s | floor tokens/s (bound) | "
        "of floor | vs best transformers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    missing = {}
    for r in doc["rows"]:
        if r.get("status") == "missing":
            missing[r["system"]] = r["why"]
            continue
        lines.append(
            f"| {r['system']} | {r['batch']} | {r['rows_equal']}/{r['batch']} | {_f(r['tokens_per_s'])} | "
            f"{_f(r['ms_per_token_per_request'])} | {_f(r['decode_tokens_per_s'])} | "
            f"{_f(r['floor_tokens_per_s'])} ({r['floor_bound']}) | {_f(r['of_floor'], '{:.2f}')} | "
            f"{_f(r.get('over_best_transformers'), '{:.2f}x')} |")
    lines += [f"| {name} | - | {why} | | | | | | |" for name, why in missing.items()]
    v = doc["verdict"]
    if v.get("measured"):
        parts = [f"at B = {v['batch']}: {v['fuelpipe']} {v['fuelpipe_tokens_per_s']:.1f} tokens/s"]
        if "over_transformers" in v:
            parts.append(f"{v['over_transformers']:.2f}x {v['transformers']} ({_target(v, 'transformers')})")
        if "over_llama_cpp" in v:
            parts.append(f"{v['over_llama_cpp']:.2f}x llama.cpp ({_target(v, 'llama_cpp')})")
        lines += ["", "Verdict " + "; ".join(parts) + "."]
    if doc.get("continuous"):
        lines += ["", "Continuous batching (requests arriving over time, mixed prompt and output lengths):", "",
                  "| system | requests | arrivals/s | total s | tokens/s | p50 latency ms | p99 latency ms | mean batch |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in doc["continuous"]:
            lines.append(f"| {c['system']} | {c['requests']} | {c['arrival_rate']:g} | {c['total_s']:.1f} | "
                         f"{_f(c['tokens_per_s'])} | {_f(c['latency_ms_p50'], '{:.0f}')} | "
                         f"{_f(c['latency_ms_p99'], '{:.0f}')} | {_f(c['mean_batch'], '{:.2f}')} |")
    return "\n".join(lines) + "\n"


def write_csv(doc: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in doc["rows"]:
            w.writerow(r)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = doc["batch_sizes"]
    floor = [doc["floor"]["per_batch"][str(b)]["tokens_per_s"] for b in sizes]
    ax.plot(sizes, floor, "k--", label="floor (bandwidth / GEMM roof)")
    for name in dict.fromkeys(r["system"] for r in doc["rows"]):
        pts = [(r["batch"], r["tokens_per_s"]) for r in doc["rows"] if r["system"] == name and r.get("tokens_per_s")]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size B (rows decoded together)")
    ax.set_ylabel("aggregate tokens/s (rows equal to B=1 only)")
    ax.set_title(f"bench_batch: {doc['model']} {doc['dtype']}, {doc['env']['threads']} threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(doc: dict, out_dirs: list[Path]) -> list[str]:
    written = []
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "bench_batch.md").write_text(markdown(doc))
        write_csv(doc, d / "bench_batch.csv")
        plot(doc, d / "bench_batch.png")
        written += [str(d / n) for n in ("bench_batch.md", "bench_batch.csv", "bench_batch.png")]
    return written


def _target(v: dict, peer: str) -> str:
    """'target 2.5x: met' for a verdict; records from before the targets were fields keep their own words."""
    if f"target_over_{peer}" in v:
        return f"target {v[f'target_over_{peer}']:g}x: {'met' if v[f'over_{peer}_met'] else 'NOT met'}"
    if peer == "transformers" and "target_2x_transformers_met" in v:
        return f"target 2x: {'met' if v['target_2x_transformers_met'] else 'NOT met'}"
    if peer == "llama_cpp" and "level_with_llama_cpp" in v:
        return f"level: {'yes' if v['level_with_llama_cpp'] else 'no'}"
    return "no target recorded"
