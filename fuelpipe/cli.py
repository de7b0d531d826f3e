"""``fuelpipe`` / ``python -m fuelpipe``: run one combination or a sweep; ``fuelpipe report DIR``.

Exit codes (the CI gate):
  0  every oracle passed (a sweep: every job that ran passed)
  1  an oracle failed (a sweep: in any job)
  2  configuration error: a misspelled group option or key, an invalid
     combination (single run), or a sweep in which every job was skipped
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fuelpipe import report
from fuelpipe.config import conf_dir
from fuelpipe.config.preflight import VERSION_BASE, preflight
from fuelpipe.errors import ConfigError
from fuelpipe.results import EXIT_CODES, FAILED, RESULTS_FILE, SKIPPED, read_results, write_results
from fuelpipe.runner.job import run_job
from fuelpipe.runner.table import render

CONFIG_EXIT = 2
CONFIG_GROUPS = ("model", "kv", "backend", "plan", "experiment")
PASSTHROUGH_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion", "resolve")


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        sys.exit(report.main(argv[1:]))
    sys.exit(run(argv))


def run(argv: list[str]) -> int:
    from hydra._internal.utils import get_args_parser  # Hydra's own parser: same flags, same meaning

    args = get_args_parser().parse_args(argv)
    try:
        pre = preflight(
            args.overrides, config_name=args.config_name or "config", config_dir=args.config_dir,
            multirun=args.multirun,
        )
    except ConfigError as err:
        print(f"fuelpipe: configuration error: {err}", file=sys.stderr)
        return CONFIG_EXIT
    if pre.problems:
        for problem in pre.problems:
            print(f"fuelpipe: configuration error: {problem}", file=sys.stderr)
        return CONFIG_EXIT
    if any(getattr(args, flag, None) for flag in PASSTHROUGH_FLAGS):
        _hydra_main(argv)  # --help, --cfg job, --info ...: Hydra answers, nothing runs
        return 0
    key = "hydra.sweep.dir" if pre.multirun else "hydra.run.dir"
    _hydra_main(argv + [f"{key}={_quoted(pre.output_dir)}"])  # pinned: the run writes where we will read
    out = Path(pre.output_dir)
    return _sweep_exit(out) if pre.multirun else _single_exit(out)


def _task(cfg: DictConfig) -> str:
    hc = HydraConfig.get()
    choices = {group: hc.runtime.choices[group] for group in CONFIG_GROUPS if group in hc.runtime.choices}
    doc = run_job(cfg, sweep=hc.mode == RunMode.MULTIRUN, overrides=list(hc.overrides.task), choices=choices)
    path = write_results(Path(hc.runtime.output_dir), doc)
    print(render(doc))
    print(f"results: {path}")
    return doc["status"]


def _hydra_main(argv: list[str]) -> None:
    """Hand ``argv`` to Hydra's own entry point (it reads sys.argv)."""
    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base=VERSION_BASE)(_task)
    saved = sys.argv
    sys.argv = [saved[0] or "fuelpipe", *argv]
    try:
        app()
    finally:
        sys.argv = saved


def _single_exit(out: Path) -> int:
    path = out / RESULTS_FILE
    if not path.is_file():
        print(f"fuelpipe: the run wrote no {path}", file=sys.stderr)
        return 1
    return EXIT_CODES.get(read_results(path)["status"], 1)


def _sweep_exit(out: Path) -> int:
    rows = report.collect_rows(out)
    if not rows:
        print(f"fuelpipe: the sweep wrote no {RESULTS_FILE} under {out}", file=sys.stderr)
        return 1
    print(report.markdown(rows))
    statuses = [row["status"] for row in rows]
    print(f"sweep: {len(rows)} jobs, " + ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses))))
    print(f"report: fuelpipe report {out}")
    if FAILED in statuses:
        return 1
    if all(s == SKIPPED for s in statuses):
        print("fuelpipe: every job of the sweep was skipped", file=sys.stderr)
        return CONFIG_EXIT
    return 0


def _quoted(value: str) -> str:
    """A Hydra override value that survives any path characters."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
