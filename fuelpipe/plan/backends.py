"""How a decode-step program is built: eager (no program), fx graph, or inductor.

The backends form a lowering chain: ``fx`` traces the step module into a
``torch.fx`` graph and runs the optimisation passes; ``inductor`` compiles that
optimised graph with ``torch.compile`` (static shapes on the tensor-offset
path; ``dynamic=True`` on the symbol path, so the two host integers compile
as symbols once instead of one recompile per token; tensor shapes there are
compiled symbolically too, a cost the symbol path accepts). Every build traces a fresh
GraphModule, so each build owns its own compiled code and dynamo's
per-code-object cache never serves one build's code to another.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.fx as fx
from torch import nn

from fuelpipe.errors import ConfigError
from fuelpipe.modes import CachePolicy, values
from fuelpipe.plan.build_tally import counted_build
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
from fuelpipe.plan.fx_passes import FX_PASSES, FxPass, fx_pass
from fuelpipe.plan.fx_trace import trace_leaves_unregistered
from fuelpipe.plan.linear_forms import materialize_lazy_linears
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.registry import Registry, did_you_mean
from fuelpipe.kv.layout import signature_named

if TYPE_CHECKING:
    from fuelpipe.plan.aot_program import PlanCacheEvent

CACHE_POLICIES = values(CachePolicy)  # the runtime's strings; the enum (fuelpipe.modes) is the one list


@dataclass(frozen=True)
class BackendSpec:
    name: str = "fx"
    # Registered pass names (or an unregistered ``FxPass`` given by value, which no config can name)
    fx_passes: tuple[str | FxPass, ...] = DEFAULT_FX_PASSES
    # What a rebuild may reuse (fuelpipe.modes.CachePolicy): "cold" = nothing compiled is reused
    # (inductor's FX-graph and autograd caches are off for the build); "warm" = on-disk /
    # in-memory compile caches may serve a rebuild. Stated in every result.
    cache_policy: str = CachePolicy.warm.value
    # Where inductor plans persist across processes (``backend.plan_cache``; off by default):
    # see fuelpipe.plan.aot_program.
    plan_cache: PlanCacheSpec = PlanCacheSpec()
    # Rows each linear of the step sees per call (1 for a single-stream step, B for a batch
    # bucket's): set by the driver when it builds a plan; passes that choose by measurement use it.
    rows: int = 1
    # Compile the prompt program with the backend's compiler too (a backend with a ``prompt_compiler``:
    # inductor), shape-generic, on its first call. Off: the prompt program runs as the traced graph.
    compile_prompt: bool = False

    def bound_weights(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors an ahead-of-time program's weights are bound to, in order: the weights themselves (a
        negative control overrides this)."""
        return weights

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ConfigError(did_you_mean("backend", self.name, BACKENDS))
        if self.cache_policy not in CACHE_POLICIES:
            raise ConfigError(f"cache_policy must be one of {list(CACHE_POLICIES)}, got {self.cache_policy!r}")
        unknown = [p for p in self.fx_passes if not isinstance(p, FxPass) and p not in FX_PASSES]
        if unknown:
            raise ConfigError(f"unknown fx passes {unknown}; available: {', '.join(FX_PASSES)}")


class CompileCounter:
    """A torch.compile backend that lowers with inductor and counts compilations."""

    def __init__(self) -> None:
        self.compiles = 0
        self.node_count: Optional[int] = None

    def __call__(self, gm: fx.GraphModule, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.compiles += 1
        self.node_count = len(gm.graph.nodes)
        return compile_fx(gm, example_inputs)


@dataclass
class StepProgram:
    backend: str
    fn: Callable
    node_count: Optional[int]
    trace_s: float
    counter: Optional[CompileCounter] = None
    passes_applied: dict[str, int] = field(default_factory=dict)
    cache_policy: str = CachePolicy.warm.value
    # The first call compiles (torch.compile and the like): it counts as build time, and a
    # program with a ``counter`` that compiled nothing is refused rather than run as eager.
    compiles_on_first_call: bool = False
    # A persistent (plan_cache) build: what its first call did (hit / miss / corrupt / mismatch, timings).
    cache_event: Optional["PlanCacheEvent"] = None

    @property
    def compiles(self) -> int:
        return self.counter.compiles if self.counter is not None else 0

    def first_call_context(self):
        """Context for the call that triggers compilation (cold policy disables compile caches)."""
        if not self.compiles_on_first_call or self.cache_policy == CachePolicy.warm.value:
            return contextlib.nullcontext()
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        stack = contextlib.ExitStack()
        stack.enter_context(inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False))
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        return stack


def trace_step(step: nn.Module, passes: tuple[str | FxPass, ...], rows: int = 1,
               sequences: Optional[int] = None) -> tuple[fx.GraphModule, dict[str, int]]:
    """``step`` traced into an fx graph with ``passes`` (registered fx pass names, or passes) applied in order.

    ``rows``: how many rows each linear sees per call, for the passes that take it; ``sequences``: how
    many sequences the step serves (the head's rows; a prompt program's 1), where it differs."""
    gm = trace_leaves_unregistered(step)
    applied = {}
    with _recompiled_once(gm):
        for entry in passes:
            run = fx_pass(entry)
            if run.takes_sequences and sequences is not None:
                applied[run.name] = run.run(gm, rows, sequences=sequences)
            else:
                applied[run.name] = run.run(gm, rows) if run.takes_rows else run.run(gm)
        materialize_lazy_linears(gm)  # a fused group no pass rewrote runs on its concatenated weight
    return gm, applied


@contextlib.contextmanager
def _recompiled_once(gm: fx.GraphModule):
    """Each pass ends in ``gm.recompile()`` so that it can run alone; in a chain only the last one matters.
    Generating the code is most of a pass's cost on a small graph (a third of a tiny model's build), and no
    pass runs the module's code, only its graph and submodules, so the chain regenerates it once."""
    gm.recompile = lambda: None  # an instance attribute: shadows the method for this module only
    try:
        yield
    finally:
        del gm.recompile
        gm.recompile()


@dataclass(frozen=True)
class BackendEntry:
    """A backend, registered by name (``fuelpipe.backends`` entry points; ``backend.name`` in the config).

    ``build(spec, step, step_kind)`` turns the step module into a ``StepProgram`` (its ``fn`` is
    called with the step's arguments every token). ``traces``: the backend runs ``spec.fx_passes``
    (``trace_step``); a backend that does not ignores them.
    """

    name: str
    build: Callable[[BackendSpec, nn.Module, str], StepProgram]
    traces: bool = True
    # gm -> a callable compiled for every prompt length (``backend.compile_prompt``); None: not offered
    prompt_compiler: Optional[Callable[[fx.GraphModule], Callable]] = None
    # Keeps compiled plans in ``backend.plan_cache.dir`` when one is set (AOTInductor packages).
    stores_plans: bool = False
    # Compiles the step ahead of time, so per-token data must all be tensors: the ``symbol`` offset
    # path (host integers) is refused by the config.
    ahead_of_time: bool = False
    # Its decode step computes the same bits at any thread count, so generation may adapt the count to
    # the machine's load (fuelpipe.threads) without changing a token. The built-in traced backends run
    # fuelpipe's kernels, which split work by output column only (tests/core/test_threads.py checks every
    # family); eager's torch linears may differ in the last bit, so eager keeps its count fixed.
    thread_invariant: bool = False
    # With ``backend.plan_cache.dir=auto`` (the default) its plans persist in the user's cache folder
    # (``user_cache_dir``). aot's stored programs hold no weights (a few MB); inductor's stored packages
    # carry the weights, so it stores only into a folder the user names.
    caches_by_default: bool = False


def _build_eager(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    return StepProgram("eager", step, None, 0.0, cache_policy=spec.cache_policy)


def _build_fx(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    t0 = time.perf_counter()
    gm, applied = trace_step(step, spec.fx_passes, spec.rows)
    return StepProgram("fx", gm, len(gm.graph.nodes), time.perf_counter() - t0, None, applied, spec.cache_policy)


def _build_inductor(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    if spec.plan_cache.enabled:
        return _build_inductor_cached(spec, step, step_kind)
    t0 = time.perf_counter()
    gm, applied = trace_step(step, spec.fx_passes, spec.rows)
    counter = CompileCounter()
    # Tensor-offset path: every shape is static. Symbol path: the two host integers vary per
    # token; dynamic=True compiles them (and the input shapes) as symbols once.
    compiled = torch.compile(gm, backend=counter, fullgraph=True, dynamic=signature_named(step_kind).symbolic)
    return StepProgram("inductor", compiled, None, time.perf_counter() - t0, counter, applied, spec.cache_policy,
                       compiles_on_first_call=True)


def _build_inductor_cached(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    """The inductor plan as a stored AOTInductor package (keyed, loaded or compiled on the first call)."""
    from fuelpipe.plan.aot_program import CachedAotStep, PlanCacheEvent, cacheable

    if not cacheable(step_kind):
        program = _build_inductor(dataclasses.replace(spec, plan_cache=PlanCacheSpec()), step, step_kind)
        program.cache_event = PlanCacheEvent(
            "uncacheable", f"step kind {step_kind!r} passes host integers: compiled with torch.compile, not stored")
        return program
    fn = CachedAotStep(spec.plan_cache, step, step_kind, functools.partial(trace_step, rows=spec.rows),
                       tuple(spec.fx_passes))
    return StepProgram("inductor", fn, None, 0.0, None, fn.passes_applied, spec.cache_policy,
                       compiles_on_first_call=True, cache_event=fn.event)


def _build_aot(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    """The step compiled ahead of time by AOTInductor (``torch.export``, then a C++ library) and called
    with no Python between operators; its weights are the model's own tensors, bound by reference.

    With ``backend.plan_cache.dir`` the package is the stored one (weights inside, keyed by their digest),
    exactly as ``backend=inductor`` stores it. A step kind passing host integers (the ``symbol`` offset
    path) cannot be compiled ahead of time: the config refuses it for a run, and an oracle's own
    symbol-path variant runs on the traced fx step instead (the graph a compile would start from, at no
    compile cost for a path this backend never serves), its build saying so (cache event ``uncacheable``)."""
    from fuelpipe.plan.aot_program import AotStep, PlanCacheEvent, cacheable

    if not cacheable(step_kind):
        program = _build_fx(spec, step, step_kind)
        program.cache_event = PlanCacheEvent(
            "uncacheable", f"step kind {step_kind!r} passes host integers: run on the traced fx step, not compiled")
        return program
    fn = AotStep(step, functools.partial(trace_step, rows=spec.rows), tuple(spec.fx_passes),
                 bound_weights=spec.bound_weights, store_dir=spec.plan_cache.dir,
                 max_bytes=spec.plan_cache.max_bytes, seed_dir=spec.plan_cache.seed)
    return StepProgram("aot", fn, None, 0.0, None, fn.passes_applied, spec.cache_policy,
                       compiles_on_first_call=True, cache_event=fn.event)


def _compile_prompt(gm: fx.GraphModule) -> Callable:
    return torch.compile(gm, fullgraph=True, dynamic=True)


BUILTIN_BACKENDS = (
    BackendEntry("eager", _build_eager, traces=False),
    BackendEntry("fx", _build_fx, thread_invariant=True),
    BackendEntry("inductor", _build_inductor, prompt_compiler=_compile_prompt, stores_plans=True,
                 thread_invariant=True),
    # the prompt program (a new length every call) stays torch.compile'd: only the held step is AOT
    BackendEntry("aot", _build_aot, prompt_compiler=_compile_prompt, stores_plans=True, ahead_of_time=True,
                 thread_invariant=True, caches_by_default=True),
)
BACKENDS: Registry[BackendEntry] = Registry("fuelpipe.backends", "backend", BackendEntry)


AUTO_CACHE_DIR = "auto"


def user_cache_dir() -> Path:
    """Where plans persist by default: ``$FUELPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fuelpipe``, else
    ``~/.cache/fuelpipe``."""
    if os.environ.get("FUELPIPE_CACHE_DIR"):
        return Path(os.environ["FUELPIPE_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "fuelpipe"


def plan_cache_dir(value: Optional[str], backend: str) -> Optional[str]:
    """``backend.plan_cache.dir`` resolved: ``auto`` is the user's cache folder for a backend that
    caches by default (aot) and off for the others; None is off; anything else is the folder given."""
    if value != AUTO_CACHE_DIR:
        return value
    entry = BACKENDS.get(backend) if backend in BACKENDS else None
    if entry is None or not entry.caches_by_default:
        return None
    folder = user_cache_dir()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        # the default must not stop a run: plans are compiled privately, and the log says why
        logging.getLogger(__name__).warning("fuelpipe: the plan cache folder %s cannot be written (%s); plans "
                                            "are built for this process only", folder, existing)
        return None
    return str(folder)


def build_program(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    with counted_build():
        program = BACKENDS.get(spec.name).build(spec, step, step_kind)
    if not isinstance(program, StepProgram):
        raise ConfigError(f"backend {spec.name!r} ({BACKENDS.source(spec.name)}) built {type(program).__name__}, "
                          "not a StepProgram")
    return program
