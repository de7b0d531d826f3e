"""The persistent plan cache's content key, checked on every backend: no compilation needed.

A stored plan is found by its content key (``fuelpipe.plan.plan_cache_key``), so
the key alone decides whether a plan compiled elsewhere is served here. It is
computed from the step's traced graph and first arguments; this module obtains
it the way a real build does, through a backend: ``PROBE`` is registered for the
duration of the check, runs the step eagerly and records the key its first
decode call would be stored under (``step_content_key`` as the build's
``PlanCacheSpec.filed_key`` files it, what the stored backends call; the negative
control's policy recasts that spec). So the key is checked on the default backend too, where nothing
is stored, and a bug in it cannot wait for the first user with a plan cache.

Both halves:

Must differ (a key that misses one serves a plan built for something else):
other weights (one element changed); another KV capacity (geometry); another intra-op thread count
(the split pass divides rows by it); a pass's source edited (same name, other
code); another pass list; another ``-march`` (the code inductor generates).

Must not differ (a key that over-keys throws every stored plan away): the same
plan built again in a fresh context; another instance of the same weights
(object ids and storages are process-local); the first decode step at another
position (positions are per-token data).
"""
from __future__ import annotations

import copy
import importlib.util
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.base import OracleInput
from fuelpipe.oracles.checks import Check
from fuelpipe.plan.aot_program import cacheable
from fuelpipe.plan.backends import BACKENDS, BackendEntry, BackendSpec, StepProgram
from fuelpipe.plan.fx_passes import FX_PASSES, FxPass
from fuelpipe.plan.plan_cache_key import PlanContentKey, step_content_key
from fuelpipe.plan.plan_store import PlanCacheSpec

PROBE = "plan_cache_key_probe"
PROBE_PASS = "plan_cache_key_probe_pass"


@dataclass
class _KeyProbe:
    """A step program that records the content key of its first call's arguments, then runs the step eagerly."""

    step: torch.nn.Module
    step_kind: str
    passes: tuple[str, ...]
    plan_cache: PlanCacheSpec
    key: Optional[PlanContentKey] = None

    def __call__(self, *args):
        if self.key is None:
            self.key = self.plan_cache.filed_key(step_content_key(self.step, args, step_kind=self.step_kind,
                                                                  fx_passes=self.passes))
        return self.step(*args)


@dataclass
class KeyProbe:
    """Keys of one oracle run: ``key(model, capacity, ...)`` builds a fresh context and returns its decode key."""

    inp: OracleInput
    built: list[_KeyProbe] = field(default_factory=list)

    def _build(self, spec: BackendSpec, step: torch.nn.Module, step_kind: str) -> StepProgram:
        probe = _KeyProbe(step, step_kind, spec.fx_passes, spec.plan_cache)
        self.built.append(probe)
        return StepProgram(PROBE, probe, None, 0.0)

    def key(self, model, capacity: int, *, passes: Optional[tuple[str, ...]] = None, lead: int = 0) -> PlanContentKey:
        """The key of ``model``'s first decode step on a fresh cache of ``capacity``, after the prompt plus
        ``lead`` more tokens (another position: per-token data)."""
        inp = self.inp
        passes = tuple(inp.setup.backend.fx_passes) if passes is None else passes
        offset = inp.setup.offset_mode if inp.setup.offset_mode and cacheable(inp.setup.offset_mode) else "tensor"
        with BACKENDS.swapped(BackendEntry(PROBE, self._build)):
            ctx = inp.setup.with_changes(backend=BackendSpec(name=PROBE, fx_passes=passes), offset_mode=offset) \
                .context(model, plan=PlanMode.plan_once, fault=inp.fault)
            cache = inp.setup.kv.new_cache(ctx, capacity)
            prompt = list(inp.prompts[0]) + [(t + 1) % model.dims.vocab_size for t in inp.prompts[0][:lead]]
            ctx.prefill(cache, prompt)
            ctx.decode(cache, prompt[0])
        key = self.built[-1].key
        assert key is not None, "the probe backend was never called: no decode step ran"
        return key


def _pass_from_source(folder: Path, tag: str, source: str) -> FxPass:
    """A no-op fx pass named PROBE_PASS whose code lives in its own file (what an installed pass looks like)."""
    path = folder / f"fuelpipe_probe_pass_{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return FxPass(PROBE_PASS, module.run)


def one_element_changed(model):
    """A copy of ``model`` whose first floating-point tensor differs in one element: other weights of the same
    config, whatever the model came from (a checkpoint's ``other_model`` is a reload, the same weights)."""
    twin = copy.deepcopy(model)
    tensor = next(t for t in (*twin.parameters(), *twin.buffers()) if t.is_floating_point() and t.numel())
    with torch.no_grad():
        flat = tensor.view(-1)
        flat[0] = flat[0] + max(1e-3, float(flat[0].abs()) * 1e-2)
    return twin


def key_checks(inp: OracleInput) -> list[Check]:
    """The key's two halves on this run's model and setup (see the module docstring)."""
    from torch._inductor import config as inductor_config

    probe = KeyProbe(inp)
    n = inp.max_seq_len
    base = probe.key(inp.model, n)
    checks = []

    def differs(name: str, other: PlanContentKey, why: str) -> None:
        changed = [f for f in base.fields() if base.fields()[f] != other.fields()[f]]
        checks.append(Check(f"key: {name} -> another key", other.digest() != base.digest(),
                            f"{why}; fields changed: {changed or 'none'}"))

    def same(name: str, other: PlanContentKey) -> None:
        changed = [f for f in base.fields() if base.fields()[f] != other.fields()[f]]
        checks.append(Check(f"key: {name} -> the same key", other.digest() == base.digest(),
                            f"fields changed: {changed or 'none'}"))

    same("the same plan in a fresh context", probe.key(inp.model, n))
    same("another instance of the same weights", probe.key(copy.deepcopy(inp.model), n))
    same("the first decode at a later position", probe.key(inp.model, n, lead=2))
    differs("other weights", probe.key(one_element_changed(inp.model), n), "a copy with one weight element changed")
    differs("another KV capacity", probe.key(inp.model, n + 16), f"capacity {n + 16} vs {n}")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        more = probe.key(inp.model, n)
    finally:
        torch.set_num_threads(threads)
    differs("another thread count", more, f"{threads + 1} vs {threads} threads")
    with inductor_config.patch({"cpp.march": "x86-64-v2"}):
        differs("another -march", probe.key(inp.model, n), "cpp.march x86-64-v2 vs the default")
    passes = tuple(inp.setup.backend.fx_passes)
    if passes:
        differs("another pass list", probe.key(inp.model, n, passes=passes[:-1]), f"without {passes[-1]}")
    with tempfile.TemporaryDirectory(prefix="fuelpipe-key-pass-") as folder:
        with FX_PASSES.swapped(_pass_from_source(Path(folder), "a", "def run(gm):\n    return 0\n")):
            first = probe.key(inp.model, n, passes=passes + (PROBE_PASS,))
        with FX_PASSES.swapped(_pass_from_source(Path(folder), "b", "def run(gm):\n    return 0  # edited\n")):
            edited = probe.key(inp.model, n, passes=passes + (PROBE_PASS,))
    checks.append(Check("key: a pass's source edited -> another key", first.digest() != edited.digest(),
                        f"recipe_source {'differs' if first.recipe_source != edited.recipe_source else 'is the same'}"))
    return checks
