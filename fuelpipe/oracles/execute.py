"""Run one registered oracle on one setup: the runner and the pytest harness share this."""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Optional

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult, Setup
from fuelpipe.oracles.registry import OracleSpec, Tolerance
from fuelpipe.plan import build_tally

log = logging.getLogger(__name__)


def numeric_form(dtype: str, model) -> str:
    """The key of a model's max-abs tolerances: its dtype (``float32``, ``bfloat16``), or
    ``int16_activations`` / ``int8_activations`` when its low-bit kernels quantize activations
    (``weights.activations=int16`` / ``int8``)."""
    fmt = getattr(model, "weight_format", None)
    activations = getattr(getattr(fmt, "activations", None), "value", None)
    return f"{activations}_activations" if activations in ("int16", "int8") else dtype


def tolerance_for(spec: OracleSpec, tolerances: Mapping[str, float], form: str) -> Optional[float]:
    """0.0 for bit-exact oracles, the numeric form's entry for max-abs ones (the oracle's default when the
    given table has none), None for counting ones."""
    if spec.tolerance is Tolerance.BIT_EXACT:
        return 0.0
    if spec.tolerance is Tolerance.MAX_ABS:
        return tolerances.get(form, spec.default_tolerance.get(form))
    return None


def execute(
    spec: OracleSpec,
    *,
    model: DecodeBackbone,
    setup: Setup,
    prompts: tuple[tuple[int, ...], ...],
    new_tokens: int,
    max_seq_len: int,
    other_model: Callable[[], DecodeBackbone],
    tolerance: Optional[float],
    control: bool = False,
    batch: BatchSpec = BatchSpec(),
    dense_model: Optional[Callable[[], DecodeBackbone]] = None,
) -> OracleResult:
    """One oracle's result; ``control`` injects its fault (the negative control: it must then fail).

    An oracle that raises has failed, with the exception as its detail; the caller goes on.
    """
    setup = spec.fault_setup(setup) if control else setup
    inp = OracleInput(
        model=model, setup=setup, prompts=prompts, new_tokens=new_tokens, max_seq_len=max_seq_len,
        other_model=other_model, tolerance=tolerance, fault=spec.fault if control else Fault.NONE, batch=batch,
        dense_model=dense_model,
    )
    t0, tally = time.perf_counter(), build_tally.current()
    try:
        result = spec.run(inp)
    except Exception as err:
        log.exception("oracle %s raised", spec.name)
        result = OracleResult(spec.name, False, {}, tolerance, f"raised {type(err).__name__}: {err}")
    result.seconds = time.perf_counter() - t0
    spent = build_tally.current().since(tally)
    result.builds, result.build_s = spent.builds, round(spent.seconds, 3)
    result.negative_control = control
    result.fault = inp.fault.value
    result.setup = setup.describe()
    return result
