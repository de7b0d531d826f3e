"""Run the experiment's enabled oracles, each on its own fresh contexts."""
from __future__ import annotations

import logging
from typing import Iterable

from omegaconf import DictConfig

from fuelpipe.config.validate import batch_spec
from fuelpipe.oracles.base import OracleResult, skipped
from fuelpipe.oracles.execute import execute, numeric_form, tolerance_for
from fuelpipe.oracles.registry import ORACLES, OracleSpec, oracle_settings
from fuelpipe.oracles.registry import enabled_oracles as registry_enabled
from fuelpipe.runner.assemble import Assembly

log = logging.getLogger(__name__)


def enabled_oracles(exp: DictConfig) -> list[str]:
    return registry_enabled(exp.oracles, exp.oracles_by_default)


def run_oracles(cfg: DictConfig, asm: Assembly, names: Iterable[str]) -> Iterable[OracleResult]:
    """Yield one result per oracle (a generator, so a caller can show progress).

    With ``experiment.fail_fast`` the oracles after the first failure are not run: each is yielded as
    skipped, naming the failure that stopped the gate.
    """
    names = list(names)
    stopped_by = None
    for i, name in enumerate(names):
        if stopped_by is not None:
            yield skipped(name, f"not run: experiment.fail_fast stopped the gate at {stopped_by}'s failure")
            continue
        log.info("phase: oracle %s (%d/%d)", name, i + 1, len(names))
        result = run_one(cfg, asm, ORACLES.get(name))
        if cfg.experiment.fail_fast and not result.passed and not result.skipped:
            stopped_by = name
            log.info("fail_fast: %s failed; the %d oracles after it are not run", name, len(names) - i - 1)
        yield result


def run_one(cfg: DictConfig, asm: Assembly, spec: OracleSpec) -> OracleResult:
    """One oracle on the model, or on the family's tiny twin when its question does not need the weights."""
    exp = cfg.experiment
    oc = oracle_settings(exp.oracles, spec.name, exp.oracles_by_default)
    twin = None if spec.needs_checkpoint or asm.twin is None else asm.twin()
    on = twin or asm
    result = execute(
        spec, model=on.model, setup=asm.setup, prompts=on.prompts, new_tokens=exp.new_tokens,
        max_seq_len=on.max_seq_len, other_model=on.other_model,
        tolerance=tolerance_for(spec, oc.tolerance, numeric_form(cfg.model.dtype.value, on.model)),
        control=bool(exp.negative_control or oc.inject_fault), batch=batch_spec(cfg.batch),
        dense_model=on.dense_model,
    )
    if twin is not None:
        result.setup["model"] = twin.label
    return result
