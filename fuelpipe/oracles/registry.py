"""The oracle registry: each oracle registered once, with its tolerance kind and its fault.

An experiment names oracles by these keys (``experiment.oracles.<name>``);
an unknown name fails with "did you mean ...? available: ...". The built-ins
below are the ``fuelpipe.oracles`` entry point of fuelpipe itself; an
installed package adds its own the same way (or ``ORACLES.register`` in-process).
"""
from __future__ import annotations

import dataclasses

import enum
from dataclasses import dataclass
from typing import Callable, Mapping

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles import (
    batch_isolation,
    batch_plan_accounting,
    batch_vs_solo,
    cache_lifecycle,
    config_variants,
    kernel_parity,
    key_sensitivity,
    kv_sharing,
    plan_accounting,
    plan_cache,
    plan_vs_replan,
    quant_quality,
    rebind_guard,
    request_isolation,
    vs_reference,
    vs_transformers,
)
from fuelpipe.oracles.base import OracleInput, OracleResult, Setup
from fuelpipe.registry import Registry


class Tolerance(enum.Enum):
    BIT_EXACT = "bit-exact"  # torch.equal; recorded tolerance 0.0
    MAX_ABS = "max-abs"  # max abs error within a per-dtype tolerance from the config
    COUNTS = "counts"  # builds / rebinds / validity verdicts; no numeric tolerance
    DERIVED = "derived"  # per output, a bound derived from the kernel's arithmetic (stated by the oracle)


@dataclass(frozen=True)
class OracleSpec:
    name: str
    run: Callable[[OracleInput], OracleResult]
    tolerance: Tolerance
    fault: Fault  # what the negative control injects; the oracle must then fail
    # The setup the fault needs to be observable, applied only under the negative control.
    fault_setup: Callable[[Setup], Setup] = lambda setup: setup
    # For oracles without an ``experiment.oracles.<name>`` entry in the config schema (those an
    # installed package adds): whether the default gate runs it, and its MAX_ABS tolerance per dtype.
    enabled_by_default: bool = False
    default_tolerance: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Whether the answer can depend on the checkpoint's weights. False for questions about the engine's
    # mechanism (plan reuse, isolation, rebinding, cache keys): the runner may ask them of the family's
    # tiny twin instead of a large checkpoint (fuelpipe/runner/twin.py).
    needs_checkpoint: bool = True


def _fx_symbol_path(setup: Setup) -> Setup:
    """NAIVE_DCE is an fx pass, and only the contiguous symbol path's KV write has no data dependency.

    A paged cache's write feeds its gather on every path, so the fault could not bite there:
    its negative control runs the same model on a contiguous cache instead. (A latent MLA
    cache has no such path; see docs/limits.md.)
    """
    kv = dataclasses.replace(setup.kv, layout="contiguous") if setup.kv.layout == "paged" else setup.kv
    return setup.with_backend("fx").with_changes(offset_mode="symbol", kv=kv)


def _plan_once(setup: Setup) -> Setup:
    """IGNORE_ALLOCATION corrupts reuse; replan reuses nothing."""
    return setup.with_changes(plan=PlanMode.plan_once)


def _fx_passes(setup: Setup) -> Setup:
    """SPLIT_PARTS_INTERLEAVED is an fx pass: eager runs none, so its control runs on fx (inductor keeps its own)."""
    return setup.with_backend("fx") if setup.backend.name == "eager" else setup


# Per numeric form (``fuelpipe.oracles.execute.numeric_form``): the model dtype, or ``int16_activations`` for
# int8 / int4 weights whose kernels quantize activations to 16 bits. There, an f32-level difference
# between two paths (another summation order in the reference, a batch GEMM against a GEMV) can move an
# activation across a rounding boundary: one step, 2^-15 of its block's largest value. Measured on
# SmolLM2 int8 and int4: up to 2.2e-4 of the logit scale between plan and reference, batch and solo.
# ``int8_activations`` (weights.activations=int8): the same crossing is one step of max / 127, 258x
# coarser. Measured on SmolLM2 int8: 2.1e-2 (vs_reference) and 2.4e-2 (vs_transformers).
_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "int16_activations": 1e-3, "int8_activations": 5e-2}


def _builtin(name, run, tolerance: Tolerance, fault: Fault, fault_setup=None, *,
             mechanism: bool = False) -> OracleSpec:
    """A built-in oracle: in the default gate; max-abs ones at 1e-5 (f32) / 2e-2 (bf16) unless configured.
    ``mechanism``: its question is about the engine, which the checkpoint's weights cannot change."""
    extra = {} if fault_setup is None else {"fault_setup": fault_setup}
    return OracleSpec(name, run, tolerance, fault, enabled_by_default=True,
                      default_tolerance=dict(_TOLERANCE) if tolerance is Tolerance.MAX_ABS else {},
                      needs_checkpoint=not mechanism, **extra)


BUILTIN_ORACLES = (
    _builtin("plan_vs_replan", plan_vs_replan.run, Tolerance.BIT_EXACT, Fault.STALE_OFFSET, mechanism=True),
    _builtin(
        "vs_reference", vs_reference.run, Tolerance.MAX_ABS, Fault.NAIVE_DCE,
        _fx_symbol_path,
    ),
    _builtin("plan_accounting", plan_accounting.run, Tolerance.COUNTS, Fault.REBUILD_EVERY_TOKEN, mechanism=True),
    _builtin("key_sensitivity", key_sensitivity.run, Tolerance.COUNTS, Fault.IGNORE_MODEL_IDENTITY, mechanism=True),
    _builtin(
        "request_isolation", request_isolation.run, Tolerance.BIT_EXACT, Fault.IGNORE_ALLOCATION,
        _plan_once, mechanism=True,
    ),
    _builtin("kv_sharing", kv_sharing.run, Tolerance.BIT_EXACT, Fault.UNSAFE_MASKED_SLOTS, kv_sharing.fault_setup,
             mechanism=True),
    _builtin("cache_lifecycle", cache_lifecycle.run, Tolerance.BIT_EXACT, Fault.STALE_ROPE, mechanism=True),
    _builtin("rebind_guard", rebind_guard.run, Tolerance.BIT_EXACT, Fault.PARTIAL_REBIND, mechanism=True),
    _builtin("vs_transformers", vs_transformers.run, Tolerance.MAX_ABS, Fault.ROPE_FREQ_EXPONENT),
    _builtin("config_variants", config_variants.run, Tolerance.MAX_ABS, Fault.SPLIT_PARTS_INTERLEAVED, _fx_passes),
    _builtin("batch_vs_solo", batch_vs_solo.run, Tolerance.MAX_ABS, Fault.SHARED_BATCH_POSITION, mechanism=True),
    _builtin("batch_isolation", batch_isolation.run, Tolerance.BIT_EXACT, Fault.STALE_PADDING_ROW, mechanism=True),
    _builtin("batch_plan_accounting", batch_plan_accounting.run, Tolerance.COUNTS, Fault.REBUILD_ON_JOIN,
             mechanism=True),
    _builtin("plan_cache", plan_cache.run, Tolerance.MAX_ABS, Fault.PLAN_CACHE_IGNORES_WEIGHTS, mechanism=True),
    _builtin("quant_quality", quant_quality.run, Tolerance.COUNTS, Fault.QUANT_WRONG_SCALE),
    _builtin("kernel_parity", kernel_parity.run, Tolerance.DERIVED, Fault.KERNEL_TAIL_DROPPED),
)
ORACLES: Registry[OracleSpec] = Registry("fuelpipe.oracles", "oracle", OracleSpec)


def oracle(name: str) -> OracleSpec:
    return ORACLES.get(name)


@dataclass(frozen=True)
class OracleSettings:
    """One oracle's settings for a run: its ``experiment.oracles.<name>`` entry, or the oracle's own defaults."""

    enabled: bool
    inject_fault: bool
    tolerance: Mapping[str, float]


def oracle_settings(oracles_cfg: Mapping, name: str, by_default: bool = True) -> OracleSettings:
    """``by_default``: the oracle set's switch (``experiment.oracles_by_default``), for an oracle the config
    does not name."""
    if name in oracles_cfg:  # the schema gives every registered oracle an entry with the spec's defaults
        oc = oracles_cfg[name]
        return OracleSettings(bool(oc.enabled), bool(oc.inject_fault), dict(oc.tolerance))
    spec = ORACLES.get(name)
    return OracleSettings(by_default and spec.enabled_by_default, False, dict(spec.default_tolerance))


def enabled_oracles(oracles_cfg: Mapping, by_default: bool = True) -> list[str]:
    """The configured oracles that are enabled, then registered ones the config does not name that run by
    default, when the oracle set (``by_default``: ``experiment.oracles_by_default``) runs those."""
    named = [name for name, oc in oracles_cfg.items() if oc.enabled]
    return named + [name for name in ORACLES if name not in oracles_cfg
                    and oracle_settings(oracles_cfg, name, by_default).enabled]
