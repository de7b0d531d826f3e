"""Run the experiment's enabled oracles, each on its own fresh contexts."""
from __future__ import annotations

import logging
import time
from typing import Iterable

from omegaconf import DictConfig

from fuelpipe.config.validate import batch_spec
from fuelpipe.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult
from fuelpipe.oracles.registry import ORACLES, OracleSpec, Tolerance, oracle_settings
from fuelpipe.oracles.registry import enabled_oracles as registry_enabled
from fuelpipe.runner.assemble import Assembly

log = logging.getLogger(__name__)


def enabled_oracles(exp: DictConfig) -> list[str]:
    return registry_enabled(exp.oracles)


def run_oracles(cfg: DictConfig, asm: Assembly, names: Iterable[str]) -> Iterable[OracleResult]:
    """Yield one result per oracle (a generator, so a caller can show progress)."""
    for name in names:
        yield run_one(cfg, asm, ORACLES.get(name))


def run_one(cfg: DictConfig, asm: Assembly, spec: OracleSpec) -> OracleResult:
    exp = cfg.experiment
    oc = oracle_settings(exp.oracles, spec.name)
    control = bool(exp.negative_control or oc.inject_fault)
    setup = spec.fault_setup(asm.setup) if control else asm.setup
    tolerance = {
        Tolerance.BIT_EXACT: 0.0,
        Tolerance.MAX_ABS: oc.tolerance.get(cfg.model.dtype.value),
        Tolerance.COUNTS: None,
    }[spec.tolerance]
    inp = OracleInput(
        model=asm.model,
        setup=setup,
        prompts=asm.prompts,
        new_tokens=exp.new_tokens,
        max_seq_len=asm.max_seq_len,
        other_model=asm.other_model,
        tolerance=tolerance,
        fault=spec.fault if control else Fault.NONE,
        batch=batch_spec(cfg.batch),
    )
    t0 = time.perf_counter()
    try:
        result = spec.run(inp)
    except Exception as err:  # an oracle that crashes has failed; the run goes on to the next one
        log.exception("oracle %s raised", spec.name)
        result = OracleResult(spec.name, False, {}, tolerance, f"raised {type(err).__name__}: {err}")
    result.seconds = time.perf_counter() - t0
    result.negative_control = control
    result.fault = inp.fault.value
    result.setup = setup.describe()
    return result
