"""One job: validate the combination, assemble it, run oracles and benchmark, return results.json."""
from __future__ import annotations

import logging
import traceback
from typing import Any, Mapping, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from fuelpipe.bench.decode import run_decode_bench
from fuelpipe.config.validate import resolve_device, validate
from fuelpipe.errors import ConfigError, InputError, KvCacheError
from fuelpipe.progress import bar
from fuelpipe.results import CONFIG_ERROR, ERROR, SKIPPED, env_info, results_doc, status_of
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.generate import plan_generation, run_generation
from fuelpipe.runner.oracles import enabled_oracles, run_oracles
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
) -> dict[str, Any]:
    """The results document of one combination; never raises (except on KeyboardInterrupt).

    Bad input (an invalid combination, an unreadable or non-finite checkpoint, a generation
    request that cannot fit) is found up front, before anything runs: ``skipped`` inside a sweep
    (the sweep goes on), ``config_error`` on its own. A crash is ``error``, with the exception
    recorded and its traceback logged.
    """
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    try:
        return _run_job(cfg, config, sweep, overrides, choices)
    except Exception as err:  # a bug, not bad input: it must not read as "an oracle failed"
        log.exception("fuelpipe: internal error in the job")
        env = env_info(_device_name(cfg), torch.get_num_threads())
        doc = results_doc(ERROR, config=config, env=env, reasons=[f"internal error: {type(err).__name__}: {err}"],
                          overrides=overrides, choices=choices)
        doc["error"] = {"type": type(err).__name__, "message": str(err), "traceback": traceback.format_exc()}
        return doc


def _run_job(cfg, config, sweep, overrides, choices) -> dict[str, Any]:
    reasons = validate(cfg)
    asm = request = None
    if not reasons:
        try:
            asm = assemble(cfg)
            _check_studies(cfg, asm)
            request = plan_generation(cfg, asm)
        except BAD_INPUT as err:  # a rule validate() cannot check before loading: still bad input
            reasons, asm = [str(err)], None
    if asm is None:
        env = env_info(_device_name(cfg), torch.get_num_threads())
        status = SKIPPED if sweep else CONFIG_ERROR
        return results_doc(status, config=config, env=env, reasons=reasons, overrides=overrides, choices=choices)

    exp = cfg.experiment
    if asm.model_record.get("family_mismatch"):
        log.warning("fuelpipe: %s", asm.model_record["family_mismatch"])
    generation = run_generation(cfg, asm, request)  # first, so a user sees real text before the checks run
    names = enabled_oracles(exp)
    peers = run_peers_experiment(cfg, asm) if exp.peers.enabled else None
    context = run_context_experiment(cfg, asm) if exp.context.enabled else None
    steps = len(names) + (exp.bench.warmup + exp.bench.tokens if exp.bench.enabled else 0)
    oracles, bench = [], None
    with bar(steps, f"fuelpipe {exp.name}") as progress:
        for result in run_oracles(cfg, asm, names):
            oracles.append(result.to_json())
            progress.update()
        if exp.bench.enabled:
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
        status_of(oracles), config=config, env=env, oracles=oracles, bench=bench, overrides=overrides, choices=choices
    )
    doc["model"] = asm.model_record
    doc["generation"] = generation
    if peers is not None:
        doc["peers"] = peers
    if context is not None:
        doc["context_scaling"] = context
    doc["load"] = asm.load or None
    return doc


def _check_studies(cfg: DictConfig, asm) -> None:
    """The speed studies' lengths against the loaded model (validate() cannot know its limit)."""
    if cfg.experiment.peers.enabled:
        from fuelpipe.bench.peers.experiment import peers_prompt

        p, limit = cfg.experiment.peers, asm.model.dims.max_position_embeddings
        peers_prompt(asm, p.prompt_tokens)  # needs the encoded prompt
        if p.prompt_tokens + p.new_tokens > limit:
            raise ConfigError(
                f"experiment.peers.prompt_tokens + new_tokens = {p.prompt_tokens + p.new_tokens} exceeds the "
                f"model's max_position_embeddings {limit}"
            )
    if cfg.experiment.context.enabled:
        c, limit = cfg.experiment.context, asm.model.dims.max_position_embeddings
        if max(c.lengths) + c.warmup + c.tokens > limit:
            raise ConfigError(
                f"experiment.context.lengths reach {max(c.lengths)} + {c.warmup + c.tokens} decode steps, "
                f"beyond the model's max_position_embeddings {limit}"
            )


def run_peers_experiment(cfg: DictConfig, asm) -> dict:
    """The peers benchmark; its table and chart go next to results.json and to ``peers.record_dir``."""
    from fuelpipe.bench.peers.experiment import run_peers, write_outputs

    p = cfg.experiment.peers
    n_systems = len(p.backends) * len(p.plans) * len(p.kv_layouts) + len(p.transformers) + 2 * p.llama_cpp
    with bar(n_systems * (1 + p.reps), "fuelpipe bench_peers") as progress:
        doc = run_peers(cfg, asm, on_progress=lambda _: progress.update())
    doc["written"] = write_outputs(doc, _output_dirs(p.record_dir))
    return doc


def _output_dirs(record_dir) -> list:
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    dirs = [Path(HydraConfig.get().runtime.output_dir)] if HydraConfig.initialized() else []
    return dirs + ([Path(record_dir)] if record_dir else [])


def run_context_experiment(cfg: DictConfig, asm) -> dict:
    """Decode ms/token against context length per KV arm; table and plot beside results.json and in record_dir."""
    from fuelpipe.bench import context_scaling as cs

    c = cfg.experiment.context
    with bar(len(c.arms) * len(c.lengths), "fuelpipe bench_context") as progress:
        rows = cs.run_context_scaling(
            asm.model, asm.setup.backend, list(c.lengths), list(c.arms), c.tokens, c.warmup,
            block_size=cfg.kv.block_size or 16, on_progress=progress.update,
        )
    doc = {"model": cfg.model.size, "dtype": cfg.model.dtype.value, "backend": asm.setup.backend.name,
           "threads": asm.threads, "tokens": c.tokens, "warmup": c.warmup, "rows": rows, "written": []}
    for d in _output_dirs(c.record_dir):
        d.mkdir(parents=True, exist_ok=True)
        (d / "context.md").write_text(cs.markdown(doc))
        cs.plot(doc, d / "context.png")
        doc["written"] += [str(d / "context.md"), str(d / "context.png")]
    return doc


def _device_name(cfg: DictConfig) -> str:
    try:
        return str(resolve_device(cfg.backend.device))
    except RuntimeError:
        return cfg.backend.device.value
