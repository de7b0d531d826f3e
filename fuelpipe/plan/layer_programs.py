"""One AOTInductor program per distinct layer shape, compiled once and kept in the plan store.

A segment (``fuelpipe.plan.layer_segments``) is a function of its outside values and of its weights;
its program is compiled from the first layer of each signature with every weight an argument, so the
package holds no weights and serves every layer of that shape, in this process and, through the store,
in any other on the same machine, torch and fuelpipe. Its key is the segment's canonical code and
argument shapes, not the weights' values: a checkpoint with other weights of the same shapes hits.

Calling a layer costs one ``boxed_run`` into the library, with the layer's weights appended to the
argument list (``LayerCall``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

import fuelpipe
from fuelpipe.errors import PlanError
from fuelpipe.plan.layer_segments import Segment
from fuelpipe.plan.plan_store import PlanStore

log = logging.getLogger(__name__)

FORMAT = "fuelpipe-layer-program/2"
COMPILE_OPTIONS = {
    # The compiler builds for the vector ISAs the CPU reports, without inductor's probe (a test library
    # compiled and loaded per ISA: 7 s on a fresh machine, 1.2 s per process after). A compiler that
    # cannot build for them fails the compile, which is then retried with the probe (``_aoti_compile``).
    "cpp.vec_isa_ok": True,
}
# How inductor works while compiling, which changes nothing in the program (so not in the key): one C++
# file per program, compiled in this process, with no pool of compile processes to start (each imports
# torch: seconds of CPU per compiling process, taken from the oracles' other workers on 2 cores).
BUILD_OPTIONS = {"compile_threads": 1}
# Not ``cpp.dynamic_threads``: it gives every loop, however small, its own OpenMP region (7 per SmolLM2
# layer against 1), 4% of a decode step. Without it inductor picks the loops worth a thread team at
# compile time, for ``compile_threads()`` threads, and those regions take the count of the call (so a
# thread governor's change of count still reaches them).


@dataclass
class LayerBuild:
    """What building the layer programs of one plan did (results.json: the plan's cache event)."""

    shapes: int = 0  # distinct layer programs the step needs
    hits: int = 0  # of those, loaded from the store
    compiled: int = 0  # of those, compiled here
    compile_s: float = 0.0
    load_s: float = 0.0
    entry_bytes: int = 0
    details: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)  # corrupt | mismatch lookups met on the way
    digests: list[str] = field(default_factory=list)  # the store entries served or written


def program_fields(segment: Segment) -> dict:
    """The store key's fields of a segment's program: what the compiled code depends on."""
    from fuelpipe.plan.plan_cache_key import machine_digest

    return {"format": FORMAT, "segment": segment.digest, "options": repr(sorted(COMPILE_OPTIONS.items())),
            "threads": compile_threads(), "torch_version": torch.__version__, "machine": machine_digest(),
            "fuelpipe_version": fuelpipe.__version__, "code": _code_digest()}


def _code_digest() -> str:
    """The source of the modules that cut and call layer programs (a change there is a new key)."""
    from fuelpipe.plan import layer_segments

    h = hashlib.sha256()
    for module in (layer_segments,):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


class _Lifted(nn.Module):
    """A segment as a function of (inputs..., state...): its module's weights replaced by the arguments."""

    def __init__(self, segment: Segment) -> None:
        super().__init__()
        self.__dict__["segment_module"] = segment.module  # not a submodule: its state arrives as arguments
        self.n_inputs = len(segment.inputs)
        self.names = list(segment.state_names)

    def forward(self, *flat):
        state = dict(zip(self.names, flat[self.n_inputs:]))
        return torch.func.functional_call(self.segment_module, state, tuple(flat[:self.n_inputs]), strict=True)


def compile_threads() -> int:
    """The thread count a program is compiled for: the machine's cores, as ``os.cpu_count()`` counts them
    (inductor's test). At that count inductor leaves a thread team's size to the call, but sizes a
    parallel reduction's per-thread scratch for it: a call at more threads is run at this many
    (``LayerCall``)."""
    return os.cpu_count() or 1


def compile_segment(segment: Segment, example_inputs: list[torch.Tensor], out: Path) -> list[list[int]]:
    """Export ``segment`` at its example arguments and compile it into an AOTInductor package at ``out``.

    A contiguous input's sizes other than 1 are exported as symbols (``Dim.AUTO``): the program then
    serves every KV capacity and batch bucket of the shape. The weights' sizes are fixed (the key holds
    them), which lets inductor specialise the layer's loops. Export keeps an input's size fixed where the
    code needs it fixed; those come back as ``static``: per argument, its sizes with -1 where it is free."""
    from torch.export import Dim

    args = tuple(example_inputs) + tuple(segment.state)
    dynamic = tuple({d: Dim.AUTO for d, n in enumerate(t.shape) if n > 1}
                    if t.is_contiguous() and k < len(example_inputs) else None
                    for k, t in enumerate(args))
    exported = torch.export.export(_Lifted(segment), args, dynamic_shapes=(dynamic,), strict=False)
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"][:len(args)]
    static = [[s if isinstance(s, int) else -1 for s in n.meta["val"].shape] for n in placeholders]
    _aoti_compile(exported, out)
    if not out.is_file():
        raise PlanError(f"AOTInductor wrote no package at {out}")
    return static


def _aoti_compile(exported, out: Path) -> None:
    """``aoti_compile_and_package`` at ``compile_threads()``, trusting the CPU's vector flags; on a failed
    build, once more with inductor's own probe of what the compiler can build."""
    from torch._inductor import cpu_vec_isa

    before = torch.get_num_threads()
    torch.set_num_threads(compile_threads())
    try:
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=str(out),
                                                     inductor_configs=dict(COMPILE_OPTIONS, **BUILD_OPTIONS))
        except Exception as err:  # noqa: BLE001 - a build error is retried once, anything else raised as it is
            if not _a_build_error(err):
                raise
            log.warning("layer program: the build for the CPU's vector ISAs failed (%s); retrying with "
                        "inductor's ISA probe", str(err)[:300])
            cpu_vec_isa.valid_vec_isa_list.cache_clear()
            # None: inductor probes, even under the env var
            options = dict(COMPILE_OPTIONS, **BUILD_OPTIONS, **{"cpp.vec_isa_ok": None})
            torch._inductor.aoti_compile_and_package(exported, package_path=str(out), inductor_configs=options)
        finally:
            cpu_vec_isa.valid_vec_isa_list.cache_clear()  # the list made under the patch is not inductor's
    finally:
        torch.set_num_threads(before)


def _a_build_error(err: BaseException) -> bool:
    """Whether ``err`` is, or wraps (inductor's ``InductorError``, a cause), a failed C++ build."""
    from torch._inductor.exc import CppCompileError

    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, CppCompileError):
            return True
        err = getattr(err, "inner_exception", None) or err.__cause__
        seen += 1
    return False


def fits(static: list[list[int]], inputs: list[torch.Tensor]) -> Optional[str]:
    """None when ``inputs`` have the sizes a program's fixed dims need; else what differs."""
    if len(static) != len(inputs):
        return f"{len(inputs)} inputs, the program takes {len(static)}"
    for k, (sizes, t) in enumerate(zip(static, inputs)):
        if len(sizes) != t.dim() or any(s != -1 and s != n for s, n in zip(sizes, t.shape)):
            return f"input {k} is {tuple(t.shape)}, the program fixes {sizes}"
    return None


class LayerProgram:
    """A loaded layer package: ``program(flat)`` runs it on (inputs..., state...) and returns its outputs."""

    def __init__(self, path: Path) -> None:
        from fuelpipe.plan.panels import kernels_available

        kernels_available()  # the package names fuelpipe's C++ operators; register them before it runs
        compiled = _load_package(path)
        self._boxed_run = compiled.loader.boxed_run
        self._compiled = compiled  # keeps the library loaded

    def __call__(self, flat: list) -> list:
        return self._boxed_run(flat)  # boxed: it takes (and empties) the list


def _load_package(path: Path):
    """``aoti_load_package``, without inductor's per-process probe of which vector ISAs the compiler can
    build for (it compiles and loads a test library per ISA in child processes, ~1.2 s): the package was
    compiled on this machine (the key holds the CPU, its flags and the compiler), so the ISAs its CPU
    reports are the ones it was built with."""
    import torch._inductor
    from torch._inductor import config as inductor_config

    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        return torch._inductor.aoti_load_package(str(path))


class LayerCall(nn.Module):
    """One layer of the assembled step: its inputs, then its own weights, into the shared program."""

    def __init__(self, program: LayerProgram, state: list[torch.Tensor]) -> None:
        super().__init__()
        self.program = program
        self.weights = list(state)  # held (not registered): the model's tensors, by reference
        self.most_threads = compile_threads()

    def forward(self, *inputs):
        threads = torch.get_num_threads()
        if threads <= self.most_threads:
            return self.program([*inputs, *self.weights])
        torch.set_num_threads(self.most_threads)  # more would overrun a reduction's per-thread scratch
        try:
            return self.program([*inputs, *self.weights])
        finally:
            torch.set_num_threads(threads)


def build_programs(groups: dict[str, list[Segment]], examples: Callable[[Segment], list[torch.Tensor]],
                   store: Optional[PlanStore], build: LayerBuild,
                   seed: Optional[PlanStore] = None) -> dict[str, LayerProgram]:
    """One program per signature: loaded from ``store`` on a hit, else copied from ``seed`` (a verified entry
    of another store), else compiled (and stored when there is one)."""
    from fuelpipe.progress import waiting

    programs: dict[str, LayerProgram] = {}
    build.shapes = len(groups)
    for signature, members in groups.items():
        first = members[0]
        inputs = examples(first) + list(first.state)  # the program's arguments: a layer's inputs, then weights
        fields = program_fields(first)
        program = None
        if store is not None:
            program, fields = _stored_program(store, fields, inputs, build)
            if program is None and seed is not None and fields and _copied(seed, store, fields, inputs):
                program, fields = _stored_program(store, fields, inputs, build)
        if program is None:
            what = f"compiling the decode step's layer program {len(programs) + 1} of {len(groups)} " \
                   f"({len(members)} layers share it)"
            with waiting(what, "about 10 s; kept for later runs" if store is not None else "about 10 s"):
                t1 = time.perf_counter()
                program = _compiled(first, inputs, store, fields, build)
                build.compile_s += time.perf_counter() - t1
            build.compiled += 1
        programs[signature] = program
    return programs


def _digest(fields: dict) -> str:
    return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()


def _stored_program(store: PlanStore, fields: dict, inputs: list[torch.Tensor],
                    build: LayerBuild) -> tuple[Optional["LayerProgram"], dict]:
    """The stored program for ``fields`` that fits ``inputs`` (None: compile one), and the fields to file
    a compiled one under: a program whose fixed sizes do not fit is filed apart, under the exact sizes."""
    for attempt in range(2):
        t0 = time.perf_counter()
        digest = _digest(fields)
        found = store.lookup(digest, fields)
        if found.status not in ("hit", "miss"):
            build.statuses.append(found.status)
            build.details.append(f"stored program {found.status}: {found.detail}; rebuilt")
        if not found.hit:
            return None, fields
        why = fits((found.extra or {}).get("static", []), inputs)
        if why is None:
            try:
                program = LayerProgram(found.path)
            except Exception as err:  # a package this torch cannot load is a rebuild, never a crash
                build.statuses.append("corrupt")
                build.details.append(f"stored program failed to load ({type(err).__name__}: {err}); rebuilt")
                store.discard(found.path.parent)
                return None, fields
            build.hits += 1
            build.digests.append(digest)
            build.load_s += time.perf_counter() - t0
            build.entry_bytes += found.path.stat().st_size
            return program, fields
        if attempt == 0:  # fixed sizes differ: the program for these exact sizes, filed apart
            fields = dict(fields, sizes=repr([tuple(t.shape) for t in inputs]))
        else:
            build.details.append(f"stored program does not fit ({why}); compiled privately")
            return None, {}
    return None, fields


def _copied(seed: PlanStore, store: PlanStore, fields: dict, inputs: list[torch.Tensor]) -> bool:
    """Copy ``seed``'s verified entry for ``fields`` into ``store`` (published as any entry is); False: none fits."""
    import shutil

    digest = _digest(fields)
    found = seed.lookup(digest, fields)
    if not found.hit or fits((found.extra or {}).get("static", []), inputs) is not None:
        return False
    store.store(digest, fields, lambda out: shutil.copyfile(found.path, out), extra=dict(found.extra or {}))
    return True


def _compiled(segment: Segment, inputs: list[torch.Tensor], store: Optional[PlanStore],
              fields: dict, build: LayerBuild) -> "LayerProgram":
    if store is None or not fields:
        return _compiled_privately(segment, inputs)
    digest = _digest(fields)
    extra: dict = {}  # meta.json is written after the payload: the compile's fixed sizes go in it

    def write(out: Path) -> None:
        extra["static"] = compile_segment(segment, inputs[:len(segment.inputs)], out)

    path, _ = store.store(digest, fields, write, extra=extra)
    build.digests.append(digest)
    if not path.exists():  # published and evicted at once (a tiny max_gb): compile privately
        return _compiled_privately(segment, inputs)
    build.entry_bytes += path.stat().st_size
    return LayerProgram(path)


def _compiled_privately(segment: Segment, args: list[torch.Tensor]) -> LayerProgram:
    with tempfile.TemporaryDirectory(prefix="fuelpipe-layer-") as tmp:
        out = Path(tmp) / "layer.pt2"
        compile_segment(segment, args[:len(segment.inputs)], out)
        return LayerProgram(out)
