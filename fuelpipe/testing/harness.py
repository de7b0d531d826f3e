"""fuelpipe's oracles on anyone's model, from a test suite: ``OracleHarness``.

The harness takes either a model (anything implementing ``DecodeBackbone``,
usually a ``DecoderModel`` subclass) or a model config name as the CLI knows
it (``"llama_tiny"``, or an installed package's ``"myfam_tiny"``), and runs
registered oracles on one combination of backend, KV strategy and plan mode::

    harness = OracleHarness(model=my_model)
    result = harness.run("plan_vs_replan", Combo(backend="fx", kv="paged"))
    harness.check("plan_vs_replan", Combo(backend="fx", kv="paged"))  # raises OracleFailure

``check`` raises ``OracleFailure`` (an ``AssertionError``) whose message is the
oracle's own account: its name, setup, tolerance, metrics and detail (the
first divergent step, the count that differed). A skipped oracle (for example
``vs_transformers`` without a twin) raises ``OracleSkipped``; the pytest plugin
turns that into a pytest skip, never a pass.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import torch

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.modes import PlanMode
from fuelpipe.errors import ConfigError
from fuelpipe.kv.spec import KvSpec
from fuelpipe.oracles.base import OracleResult, Setup
from fuelpipe.oracles.execute import execute, numeric_form, tolerance_for
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES

# The oracles that hold for any family on any backend and KV strategy, and need nothing else
# (no transformers twin, no family-specific variant configs): the plugin's default gate.
PORTABLE_ORACLES = (
    "plan_vs_replan", "vs_reference", "plan_accounting", "key_sensitivity", "request_isolation",
    "kv_sharing", "cache_lifecycle", "rebind_guard", "batch_vs_solo", "batch_isolation", "batch_plan_accounting",
)
DEFAULT_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "int16_activations": 1e-3, "int8_activations": 5e-2}
DEFAULT_PROMPTS = ((1, 2, 3, 4, 5, 6, 7, 8), (9, 10, 11, 12, 13))


class OracleFailure(AssertionError):
    """An oracle failed; the message is its full account."""

    def __init__(self, result: OracleResult) -> None:
        self.result = result
        super().__init__(describe(result))


class OracleSkipped(Exception):
    """An oracle checked nothing here (its ``detail`` says why)."""

    def __init__(self, result: OracleResult) -> None:
        self.result = result
        super().__init__(f"{result.name} skipped: {result.detail}")


def describe(result: OracleResult) -> str:
    verdict = "SKIP" if result.skipped else ("PASS" if result.passed else "FAIL")
    setup = ", ".join(f"{k}={v}" for k, v in result.setup.items())
    control = f"; negative control (fault {result.fault})" if result.negative_control else ""
    tolerance = "n/a (counts)" if result.tolerance is None else f"{result.tolerance:g}"
    metrics = ", ".join(f"{k}={v}" for k, v in result.metric.items())
    return (f"oracle {result.name} {verdict} [{setup}{control}]\n  tolerance: {tolerance}\n"
            f"  metrics: {metrics or '-'}\n  detail: {result.detail}")


@dataclass(frozen=True)
class Combo:
    """One combination to run an oracle on. ``kv=None``: latent for MLA models, contiguous otherwise."""

    backend: str = "fx"
    kv: Optional[str] = None
    plan: str = "plan_once"
    offset_mode: Optional[str] = None  # None: the model's own path
    fx_passes: tuple[str, ...] = DEFAULT_FX_PASSES

    @property
    def id(self) -> str:
        parts = [self.backend, self.kv or "auto-kv", self.plan] + ([self.offset_mode] if self.offset_mode else [])
        return "-".join(parts)

    def setup_for(self, model: DecodeBackbone) -> Setup:
        kv = self.kv or ("latent" if getattr(model, "latent_slots", None) else "contiguous")
        return Setup(BackendSpec(self.backend, tuple(self.fx_passes)), PlanMode.parse(self.plan), self.offset_mode,
                     KvSpec(layout=kv))


class OracleHarness:
    """Oracles on one model. Give ``model`` (and optionally ``other_model``) or ``config`` (a model config name)."""

    def __init__(
        self,
        model: Optional[DecodeBackbone] = None,
        *,
        config: Optional[str] = None,
        other_model: Optional[Callable[[], DecodeBackbone]] = None,
        prompts: Sequence[Sequence[int]] = DEFAULT_PROMPTS,
        new_tokens: int = 8,
        max_seq_len: Optional[int] = None,
        tolerance: Optional[Mapping[str, float]] = None,
        batch: BatchSpec = BatchSpec(4),
        overrides: Sequence[str] = (),
    ) -> None:
        if (model is None) == (config is None):
            raise ConfigError("OracleHarness needs exactly one of model= (a DecodeBackbone) or config= "
                              f"(a model config name such as 'llama_tiny'), got model={model!r} config={config!r}")
        if config is not None:
            model, other_model = _from_config(config, overrides)
        self.model = model
        self.other_model = other_model or (lambda: perturbed_copy(model))
        self.prompts = tuple(tuple(int(t) for t in p) for p in prompts)
        vocab = model.dims.vocab_size
        bad = sorted({t for p in self.prompts for t in p if not 0 <= t < vocab})
        if len(self.prompts) < 2 or any(not p for p in self.prompts) or bad:
            raise ConfigError(f"prompts must be two or more non-empty token-id lists within the vocabulary "
                              f"[0, {vocab}), got {self.prompts}")
        if new_tokens < 4:
            raise ConfigError(f"new_tokens must be >= 4 (prefill token, build token, two reused), got {new_tokens}")
        self.new_tokens = new_tokens
        self.max_seq_len = max_seq_len or max(len(p) for p in self.prompts) + new_tokens
        self.tolerance = dict(tolerance or DEFAULT_TOLERANCE)
        self.batch = batch
        self.dtype = str(next(iter(_tensors(model))).dtype).removeprefix("torch.")

    def run(self, name: str, combo: Combo = Combo(), *, negative_control: bool = False) -> OracleResult:
        spec = ORACLES.get(name)
        return execute(
            spec, model=self.model, setup=combo.setup_for(self.model), prompts=self.prompts,
            new_tokens=self.new_tokens, max_seq_len=self.max_seq_len, other_model=self.other_model,
            tolerance=tolerance_for(spec, self.tolerance, numeric_form(self.dtype, self.model)),
            control=negative_control, batch=self.batch,
        )

    def check(self, name: str, combo: Combo = Combo()) -> OracleResult:
        """The oracle's result when it passed; ``OracleFailure`` / ``OracleSkipped`` otherwise."""
        __tracebackhide__ = True  # pytest shows the oracle's account, not this frame
        result = self.run(name, combo)
        if result.skipped:
            raise OracleSkipped(result)
        if not result.passed:
            raise OracleFailure(result)
        return result

    def check_catches(self, name: str, combo: Combo = Combo()) -> OracleResult:
        """Run the oracle's negative control: its fault injected, the oracle must fail (else OracleFailure)."""
        __tracebackhide__ = True
        result = self.run(name, combo, negative_control=True)
        if result.passed:
            raise OracleFailure(dataclasses.replace(
                result, detail=f"the negative control passed: the oracle did not catch {result.fault}"))
        return result


def perturbed_copy(model: DecodeBackbone, seed: int = 1, scale: float = 0.05) -> DecodeBackbone:
    """A copy with the same structure and other weights (a new instance id): key_sensitivity's second model."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in _tensors(other):
            if t.is_floating_point():
                t.add_(scale * torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))
    return other


def _tensors(model) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _from_config(name: str, overrides: Sequence[str]):
    """(model, other_model) of a model config name, built exactly as the CLI builds it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fuelpipe.config import conf_dir, register_configs
    from fuelpipe.config.preflight import VERSION_BASE
    from fuelpipe.config.validate import validate
    from fuelpipe.runner.assemble import assemble

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf_dir()), version_base=VERSION_BASE):
            cfg = compose("config", overrides=[f"model={name}", "experiment=parity", *overrides])
    except Exception as err:  # Hydra's own message names the missing option and the search path
        raise ConfigError(f"model config {name!r} could not be composed: {err}") from None
    finally:
        GlobalHydra.instance().clear()
    reasons = [r for r in validate(cfg) if not r.startswith("experiment.")]
    if reasons:
        raise ConfigError(f"model config {name!r}: " + "; ".join(reasons))
    asm = assemble(cfg)
    return asm.model, asm.other_model
