"""The peers benchmark's Markdown table and bar chart."""
from __future__ import annotations

from pathlib import Path


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _bits(c) -> str:
    """The ``= replan bits`` cell from a row's ``plan_once_vs_replan`` comparison (None: no replan twin)."""
    if not c:
        return "-"
    if c["bit_identical"]:
        return f"yes ({c['steps']} rows)"
    return f"no ({c['rows_differing']}/{c['steps']} rows, max {c['max_abs_diff']:.2g})"


def markdown(doc: dict) -> str:
    rows, floor, env = doc["rows"], doc["floor"], doc["env"]
    peers = doc["peers"]
    lines = [
        f"# Decode speed: {doc['model']} ({doc['dtype']}), {doc['prompt_tokens']}-token prompt, "
        f"{doc['new_tokens']} new tokens, greedy, {env['threads']} threads",
        "",
        f"Machine: {env['cpu']} (extensions: {' '.join(env.get('cpu_extensions') or ['not recorded'])}); "
        f"torch {env['torch']}; "
        + ", ".join(f"{k} {v or 'not installed'}" for k, v in env.get("versions", {}).items())
        + f"; commit {env.get('git')}; fx passes {env.get('fx_passes')}; 1-min load average "
        f"{env.get('load_avg_1m_before', 0):.2f} before, {env.get('load_avg_1m_after', 0):.2f} after. "
        f"{doc['reps']} timed repetitions per system after one warm-up, systems interleaved (order rotated every "
        "repetition).",
        "",
        f"Floor: {floor['bytes_per_token'] / 1e6:.1f} MB read per token (weights {floor['weight_bytes'] / 1e6:.1f} MB "
        f"+ mean live KV {floor['kv_bytes'] / 1e6:.2f} MB) at {floor['bandwidth_gb_s']:.1f} GB/s "
        f"({floor['bandwidth_method']}) = **{floor['ms_per_token']:.2f} ms/token**.",
        "",
        "ms/token is the median of all timed decode steps (p10-p90 of the steps beside it; `reps` the range of "
        "the per-repetition medians, the run-to-run spread). GB/s and x floor only for rows running the floor's "
        "arithmetic. first token is prompt + first sample, warm; `warm-up s` is the whole first generation "
        "(plan build / compile included), `build ms` one fuelpipe plan build. "
        "`vs X` is X's ms/token over the row's (above 1: the row is faster). "
        "`= replan bits`: after the timed runs, the plan_once row and its replan twin prefill the prompt and "
        "decode the same forced tokens (the replan row's count), every logit row compared bit for bit. "
        "`tokens = ref` compares greedy ids with " + (doc["reference"] or "no reference") + " ([n tokens] when a "
        "replan row generated fewer). The fuelpipe rows share this process (peak RSS "
        f"{env.get('peak_rss_mb', 0):.0f} MB; `RSS growth` is its growth over a row's setup and warm-up, so another "
        "row's freed memory can make it negative); "
        + ("each peer runs in its own worker process (its `RSS growth` is the worker's), so a peer that crashes is "
           "a row with its status and the run goes on." if env.get("peers_isolated", True) else
           "the peers ran in this process too (experiment.peers.isolate=false).")
        + " `peak RSS` is the peak resident set of the row's process during its setup (load), its warm-up run "
        "(build: plans, compiles) and its timed runs (decode); in this process it includes every row loaded before.",
        "",
    ]
    head = ["system", "weights", "ms/token", "p10-p90", "reps", "tok/s", "GB/s", "x floor"] + [f"vs {p}" for p in peers]
    head += ["first token ms", "warm-up s", "build ms", "replan/plan_once", "= replan bits", "tokens = ref",
             "RSS growth MB", "peak RSS MB load / build / decode"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['system']} | {r['weights']} | {r['status']} |" + " |" * (len(head) - 3))
            continue
        vs = r.get("vs", {})
        match = r["tokens_match_reference"]
        match_s = "-" if match is None else ("yes" if match else f"no ({r['tokens_agreeing']}/{r['new_tokens']})")
        if r["new_tokens"] < doc["new_tokens"]:
            match_s += f" [{r['new_tokens']} tokens]"
        cells = [
            r["system"], r["weights"], _f(r["ms_per_token"]), f"{r['p10_ms']:.1f}-{r['p90_ms']:.1f}",
            f"{min(r['rep_medians_ms']):.1f}-{max(r['rep_medians_ms']):.1f}",
            _f(r["tokens_per_s"]), _f(r["achieved_gb_s"]), _f(r["over_floor"], "{:.2f}"),
        ]
        cells += [_f(vs.get(p), "{:.2f}") for p in peers]
        cells += [
            _f(r["first_token_ms"]), _f(r["warmup_run_s"]), _f(r.get("plan_build_ms")),
            _f(r.get("replan_over_plan_once"), "{:.1f}x"), _bits(r.get("plan_once_vs_replan")), match_s,
            _f(r["footprint_mb"], "{:.0f}"),
            " / ".join(_f((r.get("peak_rss_mb") or {}).get(k), "{:.0f}") for k in ("load", "build", "decode")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    best = doc.get("best_fuelpipe")
    if best:
        lines += ["", "**Best fuelpipe plan_once:** " + best["system"] + f" at {best['ms_per_token']:.1f} ms/token, "
                  f"{_f(best['over_floor'], '{:.2f}')}x the floor; " + ("; ".join(best["verdicts"]) or "no peer ran") + "."]
        if best.get("other_arithmetic"):
            lines.append("Against peers computing something else (their tokens differ; for reference only): "
                         + "; ".join(best["other_arithmetic"]) + ".")
    return "\n".join(lines) + "\n"


def bar_chart(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r.get("status") == "ok"]
    rows.sort(key=lambda r: r["ms_per_token"])
    colors = {"fuelpipe": "#1f77b4", "transformers": "#ff7f0e", "llama.cpp": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(rows) + 1.6))
    y = range(len(rows))
    med = [r["ms_per_token"] for r in rows]
    err = [[m - r["p10_ms"] for m, r in zip(med, rows)], [r["p90_ms"] - m for m, r in zip(med, rows)]]
    ax.barh(list(y), med, xerr=err, color=[colors.get(r["group"], "grey") for r in rows], capsize=2)
    ax.set_yticks(list(y), [r["system"] + ("" if r["tokens_match_reference"] in (True, None) else " (tokens differ)")
                             for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(doc["floor"]["ms_per_token"], color="black", linestyle="--", linewidth=1)
    ax.text(doc["floor"]["ms_per_token"], -0.8, " bandwidth floor", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("decode ms/token (median, p10-p90), log scale; lower is better")
    ax.set_title(f"{doc['model']} {doc['dtype']}, {doc['env']['threads']} threads, {doc['env']['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
