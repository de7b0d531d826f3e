"""One job: validate the combination, assemble it, run oracles and benchmark, return results.json."""
from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from fuelpipe.bench.decode import run_decode_bench
from fuelpipe.config.validate import resolve_device, validate
from fuelpipe.errors import ConfigError, InputError, KvCacheError
from fuelpipe.progress import bar
from fuelpipe.results import (
    CONFIG_ERROR, ERROR, INTERRUPTED, SKIPPED, env_info, results_doc, status_of, uncaught_faults,
)
from fuelpipe.plan import cache_ledger
from fuelpipe.plan.backends import BACKENDS, plan_cache_dir
from fuelpipe.runner.assemble import assemble
from fuelpipe.allocator import return_large_frees_to_os
from fuelpipe.bench.rss import PhasePeaks
from fuelpipe.runner.generate import plan_generation, run_generation
from fuelpipe.runner.oracles import enabled_oracles, run_oracles
from fuelpipe.stages import enabled_stages
from fuelpipe.weights.errors import ModelPackageMissingError, WeightsError

log = logging.getLogger(__name__)


# Errors that describe bad input (a configuration, a checkpoint, a request): caught in the up-front
# phase and reported as a configuration error. Anything else is a crash of fuelpipe itself.
BAD_INPUT = (ConfigError, InputError, KvCacheError, WeightsError, ModelPackageMissingError)


def run_job(
    cfg: DictConfig,
    *,
    sweep: bool = False,
    overrides: Sequence[str] = (),
    choices: Optional[Mapping[str, str]] = None,
    output_dir: Optional[Path] = None,
) -> dict[str, Any]:
    """The results document of one combination; never raises.

    Bad input (an invalid combination, an unreadable or non-finite checkpoint, a generation
    request that cannot fit) is found up front, before anything runs: ``skipped`` inside a sweep
    (the sweep goes on), ``config_error`` on its own. A crash is ``error``, with the exception
    recorded and its traceback logged. SIGINT (Ctrl-C) makes it ``interrupted``, with what had
    run (the model, the generated text so far, the oracles that finished); the caller stops there.
    ``output_dir``: where stages write their tables (default: Hydra's output directory, if any).
    """
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    caller_threads = torch.get_num_threads()  # backend.threads is the job's: the caller gets its own back
    partial: dict[str, Any] = {}  # sections filled in as the job goes, kept if it is interrupted
    try:
        return _run_job(cfg, config, sweep, overrides, choices, output_dir, partial)
    except KeyboardInterrupt as stop:
        env = env_info(device_name(cfg), torch.get_num_threads())
        doc = results_doc(INTERRUPTED, config=config, env=env, overrides=overrides, choices=choices,
                          reasons=["interrupted by SIGINT (Ctrl-C); the sections present ran before it, the rest "
                                   "did not run"], oracles=partial.pop("oracles", []))
        return doc | partial | getattr(stop, "partial", {})
    except Exception as err:  # a bug, not bad input: it must not read as "an oracle failed"
        log.exception("fuelpipe: internal error in the job")
        env = env_info(device_name(cfg), torch.get_num_threads())
        doc = results_doc(ERROR, config=config, env=env, reasons=[f"internal error: {type(err).__name__}: {err}"],
                          overrides=overrides, choices=choices)
        doc["error"] = {"type": type(err).__name__, "message": str(err), "traceback": traceback.format_exc()}
        return doc
    finally:
        torch.set_num_threads(caller_threads)


def _run_job(cfg, config, sweep, overrides, choices, output_dir, partial) -> dict[str, Any]:
    asm = request = None
    ledger_start = cache_ledger.mark()  # the job's cached plan builds are those recorded after this
    allocator = return_large_frees_to_os()  # before anything large is allocated (fuelpipe.allocator)
    phases = PhasePeaks()  # resident memory per phase: load, prefill, first decode (plan build), decode, checks
    phases.start("load")
    log.info("phase: load (model=%s %s, weights=%s)", cfg.model.family, cfg.model.size, cfg.model.weights.value)
    try:
        reasons = validate(cfg)
    except BAD_INPUT as err:  # e.g. two installed packages registering one family name
        reasons = [str(err)]
    if not reasons:
        try:
            asm = assemble(cfg)
            reasons = _loaded_stage_reasons(cfg, asm)
            request = plan_generation(cfg, asm)
        except BAD_INPUT as err:  # a rule validate() cannot check before loading: still bad input
            reasons = [str(err)]
        if reasons:
            asm = None
    if asm is None:
        env = env_info(device_name(cfg), torch.get_num_threads())
        status = SKIPPED if sweep else CONFIG_ERROR
        return results_doc(status, config=config, env=env, reasons=reasons, overrides=overrides, choices=choices)

    exp = cfg.experiment
    partial["model"] = asm.model_record
    if asm.model_record.get("family_mismatch"):
        log.warning("fuelpipe: %s", asm.model_record["family_mismatch"])
    cache_dir = plan_cache_dir(cfg.backend.plan_cache.dir, cfg.backend.name)
    if cache_dir is not None and not BACKENDS.get(cfg.backend.name).stores_plans:
        from fuelpipe.bench.decode import unused_plan_cache

        log.warning("fuelpipe: backend.plan_cache is set but %s", unused_plan_cache(cfg.backend.name))
    generation = run_generation(cfg, asm, request, phases=phases)  # first: a user sees text before the checks
    partial["generation"] = generation
    phases.start("checks")  # oracles, stages and the benchmark
    names = enabled_oracles(exp)
    dirs = [output_dir] if output_dir is not None else _output_dirs()
    sections = {stage.results_key: stage.run(exp[stage.name], cfg, asm, dirs) for stage in enabled_stages(exp)}
    steps = len(names) + (exp.bench.warmup + exp.bench.tokens if exp.bench.enabled else 0)
    oracles, bench = [], None
    partial["oracles"] = oracles  # the ones finished so far
    with bar(steps, f"fuelpipe {exp.name}") as progress:
        phases.part()
        for result in run_oracles(cfg, asm, names):
            oracles.append(result.to_json() | {"peak_rss_mb": round(phases.part_peak(), 1)})
            phases.part()  # the next oracle's peak starts here
            progress.update()
        if exp.bench.enabled:
            log.info("phase: benchmark (%d tokens after %d warm-up)", exp.bench.tokens, exp.bench.warmup)
            bench = run_decode_bench(
                asm.model,
                asm.setup,
                asm.prompts[0],
                warmup=exp.bench.warmup,
                tokens=exp.bench.tokens,
                max_seq_len=asm.max_seq_len,
                compare_plans=exp.bench.compare_plans,
                on_step=progress.update,
            )
    env = env_info(str(asm.device), asm.threads)
    doc = results_doc(
        status_of(oracles), config=config, env=env, oracles=oracles, bench=bench, overrides=overrides, choices=choices,
        reasons=uncaught_faults(oracles)
    )
    doc["model"] = asm.model_record
    if cache_dir is not None and BACKENDS.get(cfg.backend.name).stores_plans:
        # every cached build of the job (generation, oracles, benchmark), not the benchmark's alone
        doc["plan_cache"] = cache_ledger.summary_since(ledger_start, cache_dir)
    doc["generation"] = generation
    doc.update(sections)
    doc["load"] = asm.load or None
    doc["memory"] = memory_record(phases, asm, generation) | {"allocator": allocator}
    return doc


def memory_record(phases: PhasePeaks, asm, generation: Optional[dict]) -> dict[str, Any]:
    """Peak resident memory per phase, beside what the model's weights and the generation's KV occupy."""
    from fuelpipe.resident_memory import MB

    rec = phases.report()
    weights = sum(t.numel() * t.element_size() for t in [*asm.model.parameters(), *asm.model.buffers()]) / MB
    kv = (generation or {}).get("kv_bytes", 0) / MB
    baseline = rec["phases"].get("load", {}).get("start_mb")
    gen_phases = [v["peak_mb"] for k, v in rec["phases"].items() if k != "checks" and "peak_mb" in v]
    rec.update(weights_mb=weights, kv_mb=kv, baseline_mb=baseline,
               generate_peak_mb=max(gen_phases) if gen_phases else None)
    if baseline is not None and gen_phases and weights + kv > 0:
        # issue 15's budget: peak <= 1.3 x (weights + KV) + the interpreter's baseline
        rec["generate_peak_over_weights_and_kv"] = (max(gen_phases) - baseline) / (weights + kv)
    return rec


def _loaded_stage_reasons(cfg: DictConfig, asm) -> list[str]:
    """Each enabled stage's checks against the loaded model (its limits, its tokenizer); nothing runs yet."""
    reasons: list[str] = []
    for stage in enabled_stages(cfg.experiment):
        reasons += list(stage.check_loaded(cfg.experiment[stage.name], asm))
    return reasons


def _output_dirs() -> list:
    """The run's own output directory (Hydra's), where a stage writes its tables and plots."""
    from hydra.core.hydra_config import HydraConfig

    return [Path(HydraConfig.get().runtime.output_dir)] if HydraConfig.initialized() else []


def device_name(cfg: DictConfig) -> str:
    try:
        return str(resolve_device(cfg.backend.device))
    except RuntimeError:
        return cfg.backend.device.value
