"""A sweep job in a process of its own, watched by the launcher's worker: a crash is that job's status.

A native crash (a segfaulting kernel, an abort, the kernel's OOM killer) kills the process it happens
in. Run inside a launcher's worker it took the worker down, and the launcher then failed the whole
sweep (Ray at the first crash, killing the jobs still running; submitit after its wait, leaving them
running). Here the worker only watches: it starts ``python -m fuelpipe.runner.isolated JOB_FILE`` (a
fresh interpreter: forking a process whose OpenMP pool has run can hang the child), which runs the job
and writes its results.json; when that process dies instead, the watcher writes the job's results.json
itself, status ``crashed``, naming the signal and the job's overrides, and the sweep goes on.

The job's process dies with its watcher (Linux: ``PR_SET_PDEATHSIG``), so a lost worker leaves no job
running. SIGINT reaches both (one process group): the job records ``interrupted`` and the watcher
waits for it (a job that does not stop within ``STOP_GRACE_S`` is killed, and recorded as interrupted).
"""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from fuelpipe.child_process import die_with_parent
from fuelpipe.results import CRASHED, INTERRUPTED, RESULTS_FILE, env_info, read_results, results_doc, write_results

JOB_FILE = ".fuelpipe_job.json"  # the job as its process reads it: resolved config, overrides, choices, output dir
STOP_GRACE_S = 30.0
INTERRUPTED_EXIT = 130


def run_isolated(cfg: DictConfig, output_dir: Path, *, overrides: Sequence[str] = (),
                 choices: Optional[Mapping[str, str]] = None, log_name: str = "fuelpipe") -> dict[str, Any]:
    """Run the job ``cfg`` in a process of its own; its results document, or the one recording its crash.

    The job's process prints its results table and writes ``output_dir/results.json``; this one writes
    it only when that process did not (it died), so every job of a sweep ends with one."""
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    results = output_dir / RESULTS_FILE
    results.unlink(missing_ok=True)  # only this run's document counts
    job_file = output_dir / JOB_FILE
    job_file.write_text(json.dumps({"config": config, "overrides": list(overrides), "choices": dict(choices or {}),
                                    "output_dir": str(output_dir), "log_file": str(output_dir / f"{log_name}.log")}))
    sys.stdout.flush()
    proc = subprocess.Popen([sys.executable, "-m", "fuelpipe.runner.isolated", str(job_file)])
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = _stop(proc)
        if not results.is_file():
            write_results(output_dir, _record(INTERRUPTED, cfg, config, overrides, choices, code))
        return read_results(results)
    if results.is_file():
        return read_results(results)
    doc = _record(CRASHED, cfg, config, overrides, choices, code)
    write_results(output_dir, doc)
    print(f"fuelpipe: job {' '.join(overrides) or '(no overrides)'} crashed: {doc['crash']['detail']}", flush=True)
    return doc


def _stop(proc: subprocess.Popen) -> int:
    """The job's exit code after SIGINT: it got the signal too when it came from a terminal; else it is sent."""
    try:
        return proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def crash_detail(code: Optional[int], lost: str = "") -> tuple[Optional[str], str]:
    """(signal name or None, a sentence) for a job process's exit code (negative: killed by that signal;
    None: lost with its worker, ``lost`` saying how the launcher learnt it)."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = {"SIGKILL": " (the kernel's OOM killer sends it when memory runs out)",
               "SIGSEGV": " (a native crash: a kernel or extension read memory it may not)",
               "SIGABRT": " (a native abort)"}.get(name, "")
        return name, f"the job's process was killed by {name}{why}"
    if code is None:
        return None, f"the job was lost before it reported: its worker died ({lost or 'no detail'})"
    return None, f"the job's process exited {code} without writing {RESULTS_FILE}"


def record_lost_job(sweep_config: DictConfig, lost: str) -> Path:
    """A launcher's account of a job whose worker died before the job reported: its results.json, ``crashed``.

    ``sweep_config`` is the job's config as the launcher loads it (``load_sweep_config``, with
    ``hydra.job.num`` set and installed in ``HydraConfig``); the document lands where the job's would have."""
    hc = sweep_config.hydra
    out = Path(str(hc.sweep.dir)) / str(hc.sweep.subdir)
    cfg = OmegaConf.masked_copy(sweep_config, [k for k in sweep_config if k != "hydra"])
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    choices = {k: v for k, v in OmegaConf.to_container(hc.runtime.choices).items() if "/" not in k and v is not None}
    doc = _record(CRASHED, cfg, config, list(hc.overrides.task), choices, None, lost)
    return write_results(out, doc)


def _record(status: str, cfg, config: dict, overrides, choices, code: Optional[int], lost: str = "") -> dict[str, Any]:
    from fuelpipe.runner.job import device_name

    env = env_info(device_name(cfg), int(cfg.backend.threads or torch.get_num_threads()))
    if status == INTERRUPTED:
        reasons = ["interrupted by SIGINT (Ctrl-C) before the job recorded anything"]
        return results_doc(status, config=config, env=env, reasons=reasons, overrides=overrides, choices=choices)
    name, detail = crash_detail(code, lost)
    reason = f"crashed: {detail}; job: {' '.join(overrides) or '(no overrides)'}"
    doc = results_doc(status, config=config, env=env, reasons=[reason], overrides=overrides, choices=choices)
    doc["crash"] = {"signal": name, "exit_code": code, "detail": detail}
    return doc


def main(argv: list[str]) -> int:
    """The job's own process: run the job of ``argv[0]`` (a JOB_FILE), write and print its results."""
    die_with_parent()  # so no job outlives its sweep
    from fuelpipe.config.schema import schema_class
    from fuelpipe.runner.job import run_job
    from fuelpipe.runner.table import render

    job = json.loads(Path(argv[0]).read_text())
    out = Path(job["output_dir"])
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(job["log_file"])])
    cfg = OmegaConf.merge(OmegaConf.structured(schema_class()), job["config"])  # typed again: enums, schema
    doc = run_job(cfg, sweep=True, overrides=job["overrides"], choices=job["choices"], output_dir=out)
    path = write_results(out, doc)
    print(render(doc))
    print(f"results: {path}", flush=True)
    return INTERRUPTED_EXIT if doc["status"] == INTERRUPTED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
