"""The prompt step as a built program: traced once per step kind, with the backend's passes, held while valid.

A prompt of T tokens runs every linear on T rows at once. Eagerly that is
``F.linear``'s GEMM (measured ~65 GFLOP/s on SmolLM2's shapes at 40 rows, 2
AVX2 cores); the traced step runs each linear in the form the measured pass
picks for a prompt-sized row count (``PREFILL_ROWS``; on the machine above the
panel kernel, about 2x faster), with fused siblings, so the first token is no
longer bound by eager PyTorch.

One program per step kind serves every prompt length: the traced graph is
shape-generic (nothing in it depends on T), and the linear kernels take any
row count. With ``backend.compile_prompt`` (inductor) the graph is compiled
too, with dynamic shapes, on its first call: one compile for every prompt
length (measured on SmolLM2, 2 threads: a 16-token prompt 68 ms against 89
for the traced graph; the compile took ~2 minutes cold). Its first call's
seconds count as the program's build.

Validity follows the decode plan's rules: a program is reused only while its
key matches (the step kind, the model's structure, its weights' identity and
the thread count its forms were measured at); anything else rebuilds it. The
weights it was built from are pinned (no id is recycled while it is held). The
eager backend keeps the eager step: it is the readable reference.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from fuelpipe.plan.backends import BACKENDS, BackendSpec, trace_step
from fuelpipe.plan.build_tally import counted_build
from fuelpipe.plan.fx_passes import passes_for_rows
from fuelpipe.plan.weights_identity import WeightsPin, pin_weights, weights_identity

PREFILL_ROWS = 32  # the row count a prompt program's linear forms are measured at (a typical prompt)


@dataclass
class PrefillProgram:
    key: tuple
    fn: Callable
    pin: Optional[WeightsPin]
    build_s: float


class _CompiledOnFirstCall:
    """A compiled prompt program; its first call (the compile) is timed into the owner's build seconds."""

    def __init__(self, compiled: Callable, owner: "PrefillPlans") -> None:
        self.compiled, self.owner, self.first = compiled, owner, True
        self.compile_s = 0.0  # the first call's seconds, once made

    def __call__(self, *args):
        if not self.first:
            return self.compiled(*args)
        t0 = time.perf_counter()
        out = self.compiled(*args)
        self.first = False
        self.compile_s = time.perf_counter() - t0
        self.owner.build_s += self.compile_s
        return out


class PrefillPlans:
    """Per step kind, the held prompt program of one context (``InferenceContext.prefill`` runs it)."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.traced = BACKENDS.get(spec.name).traces
        self.programs: dict[str, PrefillProgram] = {}
        self.eager: dict[str, nn.Module] = {}
        self.builds = 0
        self.build_s = 0.0

    def step(self, model, kind: str, make_step: Callable[[], nn.Module]) -> Callable:
        """The program to run a prompt of step kind ``kind`` for ``model`` (built or rebuilt as its key requires)."""
        if not self.traced or next(model.parameters()).device.type != "cpu":
            if kind not in self.eager:
                self.eager[kind] = make_step()
            return self.eager[kind]
        key = (kind, model.shape_key(), weights_identity(model), torch.get_num_threads())
        held = self.programs.get(kind)
        if held is not None and held.key == key:
            return held.fn
        t0 = time.perf_counter()
        with counted_build():
            # A prompt's attention is many queries against many keys: SDPA's blocked form, not the per-key kernel.
            passes = tuple(p for p in passes_for_rows(self.spec.fx_passes, PREFILL_ROWS)
                           if p != "slot_attention_kernel")
            gm, _ = trace_step(make_step(), passes, PREFILL_ROWS, sequences=1)  # the head sees the last position
            compiler = BACKENDS.get(self.spec.name).prompt_compiler
            fn = _CompiledOnFirstCall(compiler(gm), self) if self.spec.compile_prompt and compiler else gm
        took = time.perf_counter() - t0
        self.programs[kind] = PrefillProgram(key, fn, pin_weights(model), took)
        self.builds += 1
        self.build_s += took
        return fn

    def drop(self) -> None:
        self.programs.clear()
        self.eager.clear()
