"""Aggregate a sweep: every results.json under a directory into one table and one plot.

    fuelpipe report DIR [--out OUT]      (or: python -m fuelpipe.report DIR)

Writes OUT/report.md, OUT/report.csv and OUT/report.png (OUT defaults to
DIR) and prints the Markdown table. Exit 0 when it wrote them, 2 when DIR
holds no results.json.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from fuelpipe.plan.cache_ledger import REBUILT
from fuelpipe.results import RESULTS_FILE, read_results, schema_problems

COLUMNS = (
    "combination", "status", "decode_ms_per_token", "plan_once_ms_per_token", "replan_ms_per_token",
    "replan_over_plan_once", "plan_build_ms", "plan_compile_ms", "plan_cache", "tokens_per_s", "oracles_passed", "notes", "path",
)
# Fields of a results document that name a combination, in label order.
LABEL_FIELDS = (
    ("model", lambda d: _model_name(d) + _overrides(d["config"]["model"]["overrides"])),
    ("dtype", lambda d: d["config"]["model"]["dtype"]),
    ("kv", lambda d: d["config"]["kv"]["layout"]),
    ("backend", lambda d: d["config"]["backend"]["name"]),
    ("device", lambda d: d["config"]["backend"]["device"]),
    ("plan", lambda d: d["config"]["plan"]["mode"]),
    ("offsets", lambda d: d["config"]["plan"]["offset_mode"] or "model"),
    ("experiment", lambda d: d["experiment"]),
)


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every well-formed results.json under ``root``, in path order."""
    found = []
    for path in sorted(Path(root).rglob(RESULTS_FILE), key=_natural):
        doc = read_results(path)
        problems = schema_problems(doc)
        if problems:
            print(f"report: skipping {path}: {problems[0]}", file=sys.stderr)
            continue
        found.append((path, doc))
    return found


def _natural(path: Path) -> list:
    """Sort key putting sweep job 2 before job 10."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(path)) if t]


def collect_rows(root: Path) -> list[dict[str, Any]]:
    return rows(collect(root), Path(root))


def rows(found: list[tuple[Path, dict[str, Any]]], root: Path) -> list[dict[str, Any]]:
    labels = _labels([doc for _, doc in found])
    out = []
    for (path, doc), label in zip(found, labels):
        bench = doc["bench"] or {}
        oracles = doc["oracles"]
        failed = [o["name"] for o in oracles if not o["passed"] and not o.get("skipped", False)]
        skipped = [o["name"] for o in oracles if o.get("skipped", False)]
        notes = "; ".join(doc["reasons"]) if doc["reasons"] else "; ".join(
            ([f"failed: {', '.join(failed)}"] if failed else []) + ([f"skipped: {', '.join(skipped)}"] if skipped else [])
        )
        out.append({
            "combination": label,
            "status": doc["status"],
            "decode_ms_per_token": bench.get("decode_ms_per_token"),
            "plan_once_ms_per_token": bench.get("plan_once_ms_per_token"),
            "replan_ms_per_token": bench.get("replan_ms_per_token"),
            "replan_over_plan_once": bench.get("replan_over_plan_once"),
            "plan_build_ms": bench.get("plan_build_ms"),
            "plan_compile_ms": (bench.get("plan_cache") or {}).get("compile_ms"),
            "plan_cache": _cache_cell(doc.get("plan_cache") or bench.get("plan_cache")),  # the job's, when it has one
            "tokens_per_s": bench.get("tokens_per_s"),
            "oracles_passed": f"{sum(bool(o['passed']) for o in oracles)}/{len(oracles)}",
            "notes": notes,
            "path": str(path.parent.relative_to(root)) if path.is_relative_to(root) else str(path.parent),
        })
    return out


def _cache_cell(pc: Optional[dict]) -> str:
    """``hits/builds`` of a persistent plan cache ("" when none was in use)."""
    if not pc:
        return ""
    if pc.get("unused"):
        return "unused"
    rebuilt = "".join(f" ({v} {k})" for k, v in (pc.get("statuses") or {}).items() if k in REBUILT)
    return f"{pc['hits']} hit / {pc['hits'] + pc['misses']}{rebuilt}"


def _labels(docs: list[dict[str, Any]]) -> list[str]:
    """Name each combination by the fields that vary across the sweep (all of them if none vary)."""
    values = [[fn(d) for _, fn in LABEL_FIELDS] for d in docs]
    varying = [i for i in range(len(LABEL_FIELDS)) if len({v[i] for v in values}) > 1] or range(len(LABEL_FIELDS))
    return [" ".join(f"{LABEL_FIELDS[i][0]}={v[i]}" for i in varying) for v in values]


def _model_name(doc: dict[str, Any]) -> str:
    """A checkpoint file by what was loaded (family:file), else the conf/model option, else family_size."""
    model, ran = doc["config"]["model"], doc.get("model") or {}
    if model.get("weights") in ("gguf", "hf_dir") and model.get("path"):
        return f"{ran.get('family') or model['weights']}:{Path(model['path']).name}"
    return doc["choices"].get("model") or f"{model['family']}_{model['size']}"


def _overrides(overrides: Optional[dict[str, Any]]) -> str:
    return "".join(f"[{k}={v}]" for k, v in sorted((overrides or {}).items()))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value).replace("|", "\\|")


def markdown(table: list[dict[str, Any]]) -> str:
    cols = [c for c in COLUMNS if c != "path"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in cols) + " |" for row in table]
    return "\n".join(lines)


def write_csv(table: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)


STATUS_COLORS = {"ok": "#2e7d32", "failed": "#c62828", "skipped": "#9e9e9e", "config_error": "#9e9e9e",
                 "error": "#6a1b9a", "crashed": "#000000", "interrupted": "#f9a825", "uncaught": "#ef6c00"}


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars of decode ms/token per combination, coloured by status."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    labels = [row["combination"] for row in table]
    values = [row["decode_ms_per_token"] or 0.0 for row in table]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.42 * len(table)))
    bars = ax.barh(range(len(table)), values, color=[STATUS_COLORS[row["status"]] for row in table])
    for bar, row in zip(bars, table):
        text = row["status"] if row["decode_ms_per_token"] is None else f"{row['decode_ms_per_token']:.2f} {row['status']}"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}", va="center", fontsize=8)
    ax.set_yticks(range(len(table)), labels, fontsize=8)
    ax.invert_yaxis()
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    ax.set_xlabel("decode ms/token (median; configured plan mode)")
    ax.set_title("fuelpipe sweep: ms/token and status per combination", fontsize=10)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(root: Path, out: Optional[Path] = None) -> Optional[list[dict[str, Any]]]:
    """Write report.md / report.csv / report.png; None when ``root`` holds no results."""
    found = collect(root)
    table = rows(found, root)
    if not table:
        return None
    out = Path(out or root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n\n".join([markdown(table)] + stage_markdown(found, root)) + "\n")
    write_csv(table, out / "report.csv")
    plot(table, out / "report.png")
    return table


def stage_markdown(found: list[tuple[Path, dict[str, Any]]], root: Path) -> list[str]:
    """Each job's experiment-stage sections (peers, context scaling, ...), rendered by their own stage."""
    from fuelpipe.runner.table import stage_sections

    out = []
    for path, doc in found:
        sections = stage_sections(doc)
        if sections:
            where = path.parent.relative_to(root) if path.parent != root else Path(root).resolve().name
            out.append(f"### {where}\n\n" + "\n\n".join(sections))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fuelpipe report", description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="a sweep (or run) directory; every results.json below it is read")
    parser.add_argument("--out", type=Path, default=None, help="where to write report.md/.csv/.png (default: DIR)")
    args = parser.parse_args(argv)
    table = write_report(args.dir, args.out)
    if table is None:
        print(f"fuelpipe report: no well-formed {RESULTS_FILE} under {args.dir}", file=sys.stderr)
        return 2
    print((Path(args.out or args.dir) / "report.md").read_text().rstrip())
    print(f"wrote {Path(args.out or args.dir) / 'report.md'}, report.csv, report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
