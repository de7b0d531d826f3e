"""``fuelpipe`` / ``python -m fuelpipe``: run one combination or a sweep; ``fuelpipe report DIR``;
``fuelpipe serve --model ...`` (an OpenAI-compatible HTTP server, ``fuelpipe.serve.cli``: its own flags).

Exit codes (the CI gate):
  0  every oracle passed (a sweep: every job that ran passed)
  1  an oracle failed (a sweep: in any job), or a job of a sweep crashed (status "crashed": its
     process died of a signal, such as a native crash or the OOM killer; the other jobs ran on)
  2  configuration error, found before anything runs: a misspelled group
     option or key, an invalid combination, a checkpoint that cannot be
     loaded (truncated, a pickle, no or an invalid config.json, non-finite
     weights), a generation request that cannot fit (an empty prompt, more
     positions than max_position_embeddings, kv.max_seq_len or kv.num_blocks
     hold); in a sweep such jobs are skipped and 2 means every job was
  3  internal error: fuelpipe itself crashed (a bug, not the input); the
     traceback is printed and recorded in results.json (status "error").
  4  a negative control was not caught: an oracle passed with its fault injected
     (status "uncaught"); the oracle cannot fail on this setup.
     A sweep exits 4 when any job's negative control was not caught, else 1 when any
     job failed or crashed, else 3 when any job raised an internal error.
  130 interrupted by SIGINT (Ctrl-C): the running job's results.json says "interrupted" and keeps
     what it had done (the generated text so far, the oracles that finished); nothing else starts.
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
from fuelpipe.config.prompt_source import read_prompt_sources
from fuelpipe.errors import ConfigError
from fuelpipe.launch import sigint_pressed
from fuelpipe.results import (
    CRASHED, ERROR, EXIT_CODES, FAILED, INTERNAL_ERROR_EXIT, INTERRUPTED, RESULTS_FILE, SKIPPED, UNCAUGHT,
    read_results, write_results,
)
from fuelpipe.runner.isolated import run_isolated
from fuelpipe.runner.job import run_job
from fuelpipe.runner.table import render

CONFIG_EXIT = 2
CONFIG_GROUPS = ("model", "kv", "backend", "plan", "oracles", "experiment")
PASSTHROUGH_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion", "resolve")


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        sys.exit(report.main(argv[1:]))
    try:
        code = _serve(argv[1:]) if argv[:1] == ["serve"] else run(argv)
    except KeyboardInterrupt:  # before the run started (reading a prompt, checking the command line)
        print("fuelpipe: interrupted (Ctrl-C) before the run started; nothing ran", file=sys.stderr)
        code = EXIT_CODES[INTERRUPTED]
    if code == EXIT_CODES[INTERRUPTED]:
        _exit_now(code)
    sys.exit(code)


def _serve(argv: list[str]) -> int:
    from fuelpipe.serve.cli import main as serve_main

    return serve_main(argv)


def _exit_now(code: int) -> None:
    """Ctrl-C: leave within a second. What the run wrote is complete (results.json and plan-cache entries are
    published by one rename); the exit handlers still run (they stop compile workers, flush logs), but not
    the interpreter's teardown of torch, which takes seconds and frees only what the kernel frees anyway."""
    import atexit
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: list[str]) -> int:
    from hydra._internal.utils import get_args_parser  # Hydra's own parser: same flags, same meaning

    args = get_args_parser().parse_args(argv)
    try:
        texts = read_prompt_sources(args.overrides)  # prompt=@FILE, prompt=-: the text itself from here on
        args.overrides = [texts.get(o, o) for o in args.overrides]
        argv = [texts.get(a, a) for a in argv]
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
    if sigint_pressed():  # Ctrl-C whose KeyboardInterrupt was swallowed on the way (fuelpipe.launch)
        raise KeyboardInterrupt
    key = "hydra.sweep.dir" if pre.multirun else "hydra.run.dir"
    out = Path(pre.output_dir)
    try:
        _hydra_main(argv + [f"{key}={_quoted(pre.output_dir)}"])  # pinned: the run writes where we will read
    except KeyboardInterrupt:
        return _interrupted(out, pre.multirun)
    except SystemExit as exit_:  # Hydra reports an exception escaping the task (printed above) with exit 1
        if exit_.code not in (None, 0):
            print(f"fuelpipe: internal error: the run stopped with exit {exit_.code} (see the error above)",
                  file=sys.stderr)
            if pre.multirun:  # what the jobs that did report wrote is still worth a table
                _sweep_exit(out)
            return INTERNAL_ERROR_EXIT
    return _sweep_exit(out) if pre.multirun else _single_exit(out)


def _task(cfg: DictConfig) -> str:
    hc = HydraConfig.get()
    choices = {group: hc.runtime.choices[group] for group in CONFIG_GROUPS if group in hc.runtime.choices}
    out, overrides = Path(hc.runtime.output_dir), list(hc.overrides.task)
    if hc.mode == RunMode.MULTIRUN:  # in a process of its own, which writes and prints; a crash is recorded here
        doc = run_isolated(cfg, out, overrides=overrides, choices=choices, log_name=hc.job.name)
    else:
        doc = run_job(cfg, overrides=overrides, choices=choices)
        path = write_results(out, doc)
        print(render(doc))
        if doc["status"] != INTERRUPTED:  # an interrupted run's path is printed once, by _interrupted
            print(f"results: {path}")
    if doc["status"] == INTERRUPTED:
        raise KeyboardInterrupt  # Ctrl-C: no further job starts
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
        print(f"fuelpipe: internal error: the run wrote no {path}", file=sys.stderr)
        return INTERNAL_ERROR_EXIT
    return EXIT_CODES.get(read_results(path)["status"], INTERNAL_ERROR_EXIT)


def _sweep_exit(out: Path) -> int:
    rows = report.collect_rows(out)
    if not rows:
        print(f"fuelpipe: internal error: the sweep wrote no {RESULTS_FILE} under {out}", file=sys.stderr)
        return INTERNAL_ERROR_EXIT
    print(report.markdown(rows))
    statuses = [row["status"] for row in rows]
    print(f"sweep: {len(rows)} jobs, " + ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses))))
    print(f"report: fuelpipe report {out}")
    for row in rows:
        if row["status"] == CRASHED:
            print(f"fuelpipe: sweep job {row['path']} {row['notes']}", file=sys.stderr)
    if INTERRUPTED in statuses:
        return EXIT_CODES[INTERRUPTED]
    if UNCAUGHT in statuses:
        return EXIT_CODES[UNCAUGHT]
    if FAILED in statuses or CRASHED in statuses:
        return EXIT_CODES[FAILED]
    if ERROR in statuses:
        print(f"fuelpipe: {statuses.count(ERROR)} job(s) of the sweep crashed (status error)", file=sys.stderr)
        return INTERNAL_ERROR_EXIT
    if all(s == SKIPPED for s in statuses):
        print("fuelpipe: every job of the sweep was skipped", file=sys.stderr)
        return CONFIG_EXIT
    return 0


def _interrupted(out: Path, multirun: bool) -> int:
    """Ctrl-C: no traceback; say where the partial results are (a sweep: its table so far); exit 130."""
    if multirun and report.collect_rows(out):
        _sweep_exit(out)
    elif not multirun and (out / RESULTS_FILE).is_file():
        print(f"results: {out / RESULTS_FILE}")
    print(f"fuelpipe: interrupted (Ctrl-C); partial results marked \"{INTERRUPTED}\" under {out}", file=sys.stderr)
    return EXIT_CODES[INTERRUPTED]


def _quoted(value: str) -> str:
    """A Hydra override value that survives any path characters."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
