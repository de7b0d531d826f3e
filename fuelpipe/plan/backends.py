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
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.fx as fx
from torch import nn

from fuelpipe.errors import ConfigError
from fuelpipe.plan.fx_passes import DEFAULT_PASSES, PASSES
from fuelpipe.step import SYMBOLIC_KINDS

BACKENDS = ("eager", "fx", "inductor")
CACHE_POLICIES = ("cold", "warm")


@dataclass(frozen=True)
class BackendSpec:
    name: str = "fx"
    fx_passes: tuple[str, ...] = DEFAULT_PASSES
    # What a rebuild may reuse: "cold" = nothing compiled is reused (inductor's
    # FX-graph and autograd caches are off for the build); "warm" = on-disk /
    # in-memory compile caches may serve a rebuild. Stated in every result.
    cache_policy: str = "warm"

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ConfigError(f"backend must be one of {list(BACKENDS)}, got {self.name!r}")
        if self.cache_policy not in CACHE_POLICIES:
            raise ConfigError(f"cache_policy must be one of {list(CACHE_POLICIES)}, got {self.cache_policy!r}")
        unknown = [p for p in self.fx_passes if p not in PASSES]
        if unknown:
            raise ConfigError(f"unknown fx passes {unknown}; available: {sorted(PASSES)}")


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
    cache_policy: str = "warm"

    @property
    def compiles(self) -> int:
        return self.counter.compiles if self.counter is not None else 0

    def first_call_context(self):
        """Context for the call that triggers compilation (cold policy disables compile caches)."""
        if self.backend != "inductor" or self.cache_policy == "warm":
            return contextlib.nullcontext()
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        stack = contextlib.ExitStack()
        stack.enter_context(inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False))
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        return stack


def trace_step(step: nn.Module, passes: tuple[str, ...]) -> tuple[fx.GraphModule, dict[str, int]]:
    gm = fx.symbolic_trace(step)
    applied = {}
    for name in passes:
        applied[name] = PASSES[name](gm)
    return gm, applied


def build_program(spec: BackendSpec, step: nn.Module, step_kind: str) -> StepProgram:
    t0 = time.perf_counter()
    if spec.name == "eager":
        return StepProgram("eager", step, None, time.perf_counter() - t0, cache_policy=spec.cache_policy)
    gm, applied = trace_step(step, spec.fx_passes)
    if spec.name == "fx":
        return StepProgram("fx", gm, len(gm.graph.nodes), time.perf_counter() - t0, None, applied, spec.cache_policy)
    counter = CompileCounter()
    # Tensor-offset path: every shape is static. Symbol path: the two host integers
    # vary per token; dynamic=True compiles them (and the input shapes) as symbols once.
    compiled = torch.compile(gm, backend=counter, fullgraph=True, dynamic=step_kind in SYMBOLIC_KINDS)
    return StepProgram("inductor", compiled, None, time.perf_counter() - t0, counter, applied, spec.cache_policy)
