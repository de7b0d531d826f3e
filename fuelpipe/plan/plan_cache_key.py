"""The content key of a persistent plan: what a compiled step is, independent of the process that built it.

The in-process plan key (``fuelpipe.plan.validity.PlanKey``) names objects: instance
ids, storage addresses and version counters, which mean nothing in another process
and must never be written to disk. A plan stored on disk is found by content instead:

* ``graph``: a digest of the step traced into an fx graph before any pass, so every
  structural fact (layer count, head layout, norm epsilon, RoPE plan, masks) that
  reaches the computation is in it, whatever the config object says;
* ``weights``: a digest of every tensor the graph reads (name, dtype, shape, bytes);
  the compiled package bakes them, so another checkpoint must never match;
* ``inputs``: shape, dtype, stride and device of every step argument (the geometry:
  KV capacity, block table width, batch rows);
* the build recipe: backend, fx passes (and the source of the modules that implement
  them, an installed package's passes included), the intra-op thread count the split pass
  divides by, the torch version, and the machine the code was generated for: inductor
  compiles for the host (``-march=native``), so the CPU model, its feature flags, the
  ``-march`` setting and the C++ compiler with its version are in the key, and a folder
  shared by a cluster never hands one CPU's library to another.

``PlanContentKey.digest()`` names the entry; ``fields()`` is stored beside it and must
match exactly on load (a digest collision or a tampered entry is a rebuild, not a hit).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import torch.fx as fx

import fuelpipe
from fuelpipe.machine import cpu_model_and_flags

FORMAT = "fuelpipe-plan-cache/1"
# Source files whose code shapes what a plan compiles beyond the traced graph: the passes
# and the kernels they call. An edit to any of them changes every key.
_RECIPE_MODULES = ("fuelpipe.plan.fx_passes", "fuelpipe.plan.split_gemv", "fuelpipe.plan.derived_weights",
                   "fuelpipe.plan.aot_program", "fuelpipe.kv.slot_attention", "fuelpipe.plan.linear_forms",
                   "fuelpipe.plan.linear_rewrite", "fuelpipe.plan.rows_linear")


@dataclass(frozen=True)
class PlanContentKey:
    graph: str
    weights: str
    inputs: str
    step_kind: str
    backend: str
    fx_passes: tuple[str, ...]
    recipe_source: str
    threads: int
    torch_version: str
    cpu_capability: str
    machine: str  # digest of CPU model, CPU flags, -march and compiler (machine_digest)
    fuelpipe_version: str
    format: str = FORMAT

    def fields(self) -> dict[str, Any]:
        d = asdict(self)
        d["fx_passes"] = list(self.fx_passes)
        return d

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()[:40]


def graph_digest(gm: fx.GraphModule) -> str:
    return hashlib.sha256(gm.code.encode()).hexdigest()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().to("cpu").contiguous()
    return memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else memoryview(b"")


def weights_digest(gm: fx.GraphModule) -> str:
    """sha256 over every tensor the graph can read: its name, dtype, shape and bytes.

    That is every parameter and buffer of the traced module (leaf modules such as ``nn.Linear``
    are ``call_module`` nodes, whose weights no ``get_attr`` names) and every plain tensor
    attribute a ``get_attr`` node reads.
    """
    tensors: dict[str, torch.Tensor] = dict(gm.named_parameters(remove_duplicate=False))
    tensors.update(gm.named_buffers(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in tensors:
            value = _resolve(gm, node.target)
            if isinstance(value, torch.Tensor):
                tensors[node.target] = value
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        h.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        h.update(_tensor_bytes(value))
    return h.hexdigest()


def _resolve(root: torch.nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def inputs_digest(args: Iterable[Any]) -> str:
    """The step's argument signature: what the geometry of a compiled plan is made of."""
    return hashlib.sha256(json.dumps(_signature(list(args))).encode()).hexdigest()


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), list(value.stride()), str(value.dtype), str(value.device)]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_signature(v) for v in value]]
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    raise TypeError(f"plan cache: cannot key a step argument of type {type(value).__name__}")


def recipe_source_digest(fx_passes: Iterable = (), modules: Iterable[str] = _RECIPE_MODULES) -> str:
    """The source of fuelpipe's plan-building modules and of the file defining each pass in ``fx_passes``
    (registered names, or passes given by value)."""
    import importlib

    from fuelpipe.plan.fx_passes import fx_pass

    files = {Path(importlib.import_module(name).__file__) for name in modules}
    for entry in fx_passes:
        source = inspect.getsourcefile(fx_pass(entry).run)
        if source:
            files.add(Path(source))
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(str(path.name).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@functools.cache
def cpp_compiler_and_version() -> tuple[str, str]:
    """inductor's C++ compiler and its version string (asked once: it runs the compiler)."""
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    try:
        compiler = get_cpp_compiler()
        return compiler, get_compiler_version_info(compiler)
    except Exception as err:  # no compiler: inductor cannot build either; the key still says so
        return f"unavailable ({type(err).__name__})", ""


def machine_digest() -> str:
    """What the generated code was compiled for: CPU model and flags, ``-march``, the C++ compiler and its version.

    ``-march`` is read on every call (it is a setting a user may change); the CPU and compiler are asked once.
    """
    from torch._inductor import config as inductor_config

    model, flags = cpu_model_and_flags()
    compiler, compiler_version = cpp_compiler_and_version()
    parts = [platform.machine(), model, flags, str(inductor_config.cpp.march), compiler, compiler_version]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cpu_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an older or unusual build: name the machine instead
        return platform.machine()


def content_key(gm: fx.GraphModule, args: tuple, *, step_kind: str, backend: str, fx_passes: tuple,
                recipe: Optional[str] = None) -> PlanContentKey:
    """The key of the plan ``gm`` (traced, no passes applied yet) would compile to for ``args``."""
    from fuelpipe.plan.fx_passes import fx_pass

    return PlanContentKey(
        graph=graph_digest(gm),
        weights=weights_digest(gm),
        inputs=inputs_digest(args),
        step_kind=step_kind,
        backend=backend,
        fx_passes=tuple(fx_pass(p).name for p in fx_passes),
        recipe_source=recipe if recipe is not None else recipe_source_digest(fx_passes),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        cpu_capability=cpu_capability(),
        machine=machine_digest(),
        fuelpipe_version=fuelpipe.__version__,
    )


def step_content_key(step: torch.nn.Module, args: tuple, *, step_kind: str, fx_passes: tuple) -> PlanContentKey:
    """The key a stored plan of ``step`` called with ``args`` is filed under (inductor and aot share the packages)."""
    from fuelpipe.plan.fx_trace import trace_leaves_unregistered

    raw = trace_leaves_unregistered(step)
    return content_key(raw, args, step_kind=step_kind, backend="inductor", fx_passes=fx_passes)
