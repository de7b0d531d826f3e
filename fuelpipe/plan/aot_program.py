"""An inductor plan that outlives the process: the step compiled ahead of time and kept on disk.

With ``backend.plan_cache.dir`` set, the inductor backend builds the step as an
AOTInductor package (``torch.export`` of the pass-optimised fx graph, compiled by
inductor into a shared library with the weights baked in) instead of a
``torch.compile`` program, and stores it under the step's content key
(``fuelpipe.plan.plan_cache_key``). A later build with the same key, in this process
or any other that reads the folder, loads the package: no tracing, no passes, no
compilation. The build is lazy: the key needs the step's first arguments (its
geometry), so the first call keys, loads or compiles, and runs.

Per-token data stays data: the package takes the same arguments as the fx step
(token, RoPE rows, mask, write index, block table or slots, bound KV list) and
writes the KV tensors it is given in place. Step kinds that pass host integers
(the ``symbol`` offset paths) are not stored, since an integer argument would be
compiled as a constant: the config refuses them with a plan cache, and an oracle's
own symbol-path variant is built uncached: by torch.compile on ``backend=inductor``,
as the traced fx step on ``backend=aot`` (see ``cacheable``).

``backend=aot`` (``AotStep``) compiles the same package in-process without the weights
and binds it to the very tensors the traced graph holds (the model's parameters and the
plan's derived copies), so nothing is copied; with ``backend.plan_cache.dir`` set it
stores and loads exactly as the inductor backend does.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from fuelpipe.errors import PlanError
from fuelpipe.plan import cache_ledger
from fuelpipe.plan.plan_cache_key import step_content_key
from fuelpipe.plan.plan_store import PlanCacheSpec, PlanStore
from fuelpipe.kv.layout import signature_named

log = logging.getLogger(__name__)


@dataclass
class PlanCacheEvent:
    """What one cached build did, for the plan's stats and results.json."""

    # hit | miss | corrupt | mismatch (the last three compiled) | uncacheable | private (backend=aot, not stored)
    status: str = ""
    detail: str = ""
    key: str = ""
    key_s: float = 0.0  # tracing for the key, hashing weights and inputs
    compile_s: float = 0.0  # passes, export and AOT compilation (0 on a hit)
    load_s: float = 0.0  # verifying and loading the package
    published: Optional[bool] = None  # a compile: whether this process's entry was the one kept
    entry_bytes: int = 0
    # The stored programs take the weights as arguments (backend=aot's layer programs): one entry serves
    # every checkpoint of the same shapes, so other weights are the same key, not another one.
    weights_bound: bool = False

    @property
    def hit(self) -> bool:
        return self.status == "hit"

    def record(self) -> dict:
        return {"status": self.status, "detail": self.detail, "key": self.key, "key_s": round(self.key_s, 4),
                "compile_s": round(self.compile_s, 4), "load_s": round(self.load_s, 4),
                "published": self.published, "entry_bytes": self.entry_bytes}


def cacheable(step_kind: str) -> bool:
    """Whether a step kind can be stored: its per-token data must all be tensors.

    The symbolic signatures (``symbol``, ``paged_symbol``, ``batch_symbol``) pass host integers, which a stored plan would bake as constants. The
    config refuses a plan cache on that path up front; a variant an oracle builds there on its
    own (a cached run's symbol-path comparison) is built uncached (torch.compile on inductor, the
    traced fx step on aot), and its build says so (``PlanCacheEvent.status == "uncacheable"``).
    """
    return not signature_named(step_kind).symbolic


class _BuiltOnFirstCall:
    """A program built on its first call (building needs the step's arguments: its geometry), then run."""

    _run: Optional[Callable] = None

    def __call__(self, *args):
        if self._run is None:
            self._run = self._realize(args)
        return self._run(*args)

    def _realize(self, args: tuple) -> Callable:
        raise NotImplementedError


@dataclass
class CachedAotStep(_BuiltOnFirstCall):
    """The program ``fn`` of a cached inductor plan: keys, loads or compiles on its first call."""

    spec_cache: PlanCacheSpec
    step: nn.Module
    step_kind: str
    trace: Callable  # (step, passes) -> (GraphModule, applied passes): fuelpipe.plan.backends.trace_step
    passes: tuple[str, ...]
    event: PlanCacheEvent = field(default_factory=PlanCacheEvent)
    passes_applied: dict = field(default_factory=dict)

    def _realize(self, args: tuple) -> Callable:
        run = self._load_or_compile(args)
        cache_ledger.record(self.spec_cache.dir, self.event.record())  # the job's account of every cached build
        return run

    def _load_or_compile(self, args: tuple) -> Callable:
        store = PlanStore(self.spec_cache.dir, self.spec_cache.max_bytes)
        t0 = time.perf_counter()
        key = self.spec_cache.filed_key(step_content_key(self.step, args, step_kind=self.step_kind,
                                                         fx_passes=self.passes))
        fields, digest = key.fields(), key.digest()
        ev = self.event
        ev.key, ev.key_s = digest, time.perf_counter() - t0
        t1 = time.perf_counter()
        found = store.lookup(digest, fields)
        ev.status, ev.detail = found.status, found.detail
        if found.hit:
            try:
                run = _load(found.path)
                self.passes_applied.update((found.extra or {}).get("passes_applied", {}))
                ev.load_s = time.perf_counter() - t1
                ev.entry_bytes = found.path.stat().st_size
                return run
            except Exception as err:  # a package this torch cannot load is a rebuild, never a crash
                ev.status, ev.detail = "corrupt", f"load failed: {type(err).__name__}: {err}"
                store.discard(found.path.parent)
        t2 = time.perf_counter()
        log.info("plan cache: compiling entry %s into %s (%s)", digest[:16], self.spec_cache.dir, ev.status)
        gm, applied = self.trace(self.step, self.passes)
        self.passes_applied.update(applied)
        path, ev.published = store.store(digest, fields, lambda out: _compile(gm, args, out),
                                         extra={"passes_applied": applied})
        ev.compile_s = time.perf_counter() - t2
        t3 = time.perf_counter()
        run = _load(path) if path.exists() else _load_compiled_anyway(gm, args)
        ev.load_s = time.perf_counter() - t3
        ev.entry_bytes = path.stat().st_size if path.exists() else 0
        return run


@dataclass
class AotStep(_BuiltOnFirstCall):
    """The program ``fn`` of ``backend=aot``: the step compiled ahead of time on its first call and held.

    The optimised graph is cut into layers (``fuelpipe.plan.layer_segments``); each distinct layer
    shape is compiled once into an AOTInductor library that takes the layer's weights as arguments
    (``fuelpipe.plan.layer_programs``), so a 30-layer model compiles one program, not 30 layers' worth,
    and the packages hold no weights. With a store (``store_dir``: the plan cache) a program compiled by
    any earlier process on this machine is loaded instead. The step then runs as fx code: the prologue
    (embedding, per-layer slices of the step's inputs), one library call per layer, the head.

    A graph that cannot be cut (``NotSegmentable``) is compiled whole, as one package bound to the very
    tensors the traced graph holds (``_realize_whole``); the event's detail says why.
    """

    step: nn.Module
    trace: Callable  # (step, passes) -> (GraphModule, applied passes): fuelpipe.plan.backends.trace_step
    passes: tuple[str, ...]
    # the tensors the program's weights are bound to, in order: ``BackendSpec.bound_weights``
    bound_weights: Callable[[list[torch.Tensor]], list[torch.Tensor]]
    store_dir: Optional[str] = None  # the plan cache folder; None: compile privately, keep nothing
    max_bytes: int = 8 << 30
    seed_dir: Optional[str] = None  # a folder to copy verified programs from on a miss (never written)
    layered: bool = True  # False: compile the whole step as one package (the former build, for comparison)
    event: PlanCacheEvent = field(default_factory=lambda: PlanCacheEvent(status="private"))
    passes_applied: dict = field(default_factory=dict)
    layer_build: Optional[object] = None  # fuelpipe.plan.layer_programs.LayerBuild, once built

    def _realize(self, args: tuple) -> Callable:
        from fuelpipe.plan.layer_segments import NotSegmentable

        t0 = time.perf_counter()
        gm, applied = self.trace(self.step, self.passes)
        self.passes_applied.update(applied)
        _prewarmed()
        self.event.key_s = time.perf_counter() - t0
        if self.layered:
            try:
                run = self._realize_layered(gm, args)
                if self.store_dir is not None:
                    cache_ledger.record(self.store_dir, self.event.record())
                return run
            except NotSegmentable as why:
                log.info("aot: compiling the whole step: %s", why)
                self.event.detail = f"compiled whole: {why}"
        return self._realize_whole(gm, args)

    def _realize_layered(self, gm, args: tuple) -> Callable:
        from fuelpipe.plan.layer_programs import LayerBuild, LayerCall, build_programs
        from fuelpipe.plan.layer_segments import assemble, cut, group_by_signature, record_values

        t0 = time.perf_counter()
        values = record_values(gm, args)
        the_cut = cut(gm, values, self.step.backbone.dims.n_layers)
        groups = group_by_signature(the_cut.segments)
        self.event.key_s += time.perf_counter() - t0
        store = PlanStore(self.store_dir, self.max_bytes) if self.store_dir is not None else None
        seed = PlanStore(self.seed_dir, self.max_bytes) if self.seed_dir is not None and store is not None else None
        build = self.layer_build = LayerBuild()
        programs = build_programs(groups, lambda s: [values[i] for i in s.inputs], store, build, seed=seed)
        calls = [LayerCall(programs[s.signature], self.bound_weights(s.state)) for s in the_cut.segments]
        run = assemble(gm, the_cut, calls)
        ev = self.event
        ev.status = "private" if store is None else ("hit" if build.compiled == 0 else "miss")
        if build.statuses:  # a corrupt or mismatched entry met on the way: said, though it was rebuilt
            ev.status = build.statuses[0]
        ev.key = "+".join(build.digests)
        ev.weights_bound = True
        ev.detail = (f"{build.shapes} layer program(s) for {len(the_cut.segments)} layers: "
                     f"{build.hits} loaded, {build.compiled} compiled" + "".join(f"; {d}" for d in build.details))
        ev.compile_s, ev.load_s, ev.entry_bytes = build.compile_s, build.load_s, build.entry_bytes
        return run

    def _realize_whole(self, gm, args: tuple) -> Callable:
        import tempfile

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="fuelpipe-aot-") as tmp:
            out = Path(tmp) / "plan.pt2"
            constants = _compile(gm, args, out, weights_in_package=False)
            t1 = time.perf_counter()
            run = _load(out)
            self.event.entry_bytes = out.stat().st_size
        run.bind_constants(dict(zip(constants, self.bound_weights(list(constants.values())))))
        self.event.compile_s, self.event.load_s = t1 - t0, time.perf_counter() - t1
        return run


def _compile(gm, args: tuple, out: Path, weights_in_package: bool = True) -> dict[str, torch.Tensor]:
    """Export ``gm`` at ``args``'s shapes and compile it into an AOTInductor package at ``out``.

    Returns the exported program's constants by name (parameters, buffers, tensor constants): the
    tensors a package compiled without its weights must be bound to."""
    exported = torch.export.export(gm, tuple(args), strict=False)
    options = None if weights_in_package else {"aot_inductor.package_constants_in_so": False}
    torch._inductor.aoti_compile_and_package(exported, package_path=str(out), inductor_configs=options)
    if not out.is_file():
        raise PlanError(f"AOTInductor wrote no package at {out}")
    return {**exported.state_dict, **exported.constants}


def _load(path: Path) -> Callable:
    import torch._inductor

    from fuelpipe.plan.panels import kernels_available

    # A stored plan may call fuelpipe's C++ operators (panel linears, batch-slot attention), which the
    # package names but does not carry: register them before it runs. On a hit no pass runs to do it,
    # and a fresh process has not loaded them (where they cannot be built, no such plan was stored).
    kernels_available()
    return AotCall(torch._inductor.aoti_load_package(str(path)))


def _tensor_leaves(x, out: list) -> bool:
    """Append the tensors of ``x`` (tensors, lists and tuples of them, None) in pytree order; False
    for anything else, which takes the package's own general call."""
    if isinstance(x, torch.Tensor):
        out.append(x)
        return True
    if type(x) in (list, tuple):
        return all(_tensor_leaves(item, out) for item in x)
    return x is None


class AotCall:
    """A loaded AOTInductor package, called per step without re-parsing its call spec.

    The package's own ``__call__`` parses its input and output specs from JSON and runs a general
    pytree flatten on every call; a step's arguments are tensors and lists of them, so they are
    flattened here and the output spec is parsed once. The first call of each leaf count is checked
    against the general flatten (same tensors, same order) before the short path serves it.
    """

    def __init__(self, compiled) -> None:
        from torch.utils import _pytree as pytree

        self.compiled = compiled
        self._unflatten = pytree.tree_unflatten
        self._out_spec = pytree.treespec_loads(compiled.loader.get_call_spec()[1])
        self._boxed_run = compiled.loader.boxed_run
        self._checked: set[int] = set()  # leaf counts whose short flatten matched the general one

    def __call__(self, *args):
        flat: list = []
        if not _tensor_leaves(args, flat):
            return self.compiled(*args)
        if len(flat) not in self._checked:
            from torch.utils import _pytree as pytree

            general = [x for x in pytree.tree_flatten((args, {}))[0] if isinstance(x, torch.Tensor)]
            if len(general) != len(flat) or any(a is not b for a, b in zip(general, flat)):
                return self.compiled(*args)
            self._checked.add(len(flat))
        return self._unflatten(self._boxed_run(flat), self._out_spec)

    def bind_constants(self, constants: dict[str, torch.Tensor]) -> None:
        """Point a package compiled without its weights at ``constants`` (by name), without copying.

        Every name the package needs must be given (a missing one is a ``PlanError`` naming it); the
        tensors are not copied, so they must outlive the package: the plan holding both keeps them."""
        needed = list(self.compiled.get_constant_fqns())
        missing = [name for name in needed if name not in constants]
        if missing:
            raise PlanError(f"AOT package needs constants the exported step does not hold: {missing[:5]}"
                            f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {len(needed)})")
        self._constants = {name: constants[name] for name in needed}  # held: the package reads them in place
        self.compiled.load_constants(self._constants, check_full_update=True, user_managed=True)

    def __getattr__(self, name):  # get_metadata, load_constants, ...: the package's own
        return getattr(self.compiled, name)


def _load_compiled_anyway(gm, args: tuple) -> Callable:
    """The published entry vanished between publishing and loading (evicted): compile privately."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.pt2"
        _compile(gm, args, out)
        return _load(out)


_prewarm: Optional[threading.Thread] = None


def prewarm_compiler() -> None:
    """Import inductor on a background thread, once per process.

    A fresh process spends about 1.5 s importing inductor before its first AOT package can load: started
    before the weights are read (``fuelpipe.load``, the runner's ``assemble``), the import overlaps the
    load instead of delaying the first token. The build joins the thread before it needs inductor."""
    global _prewarm
    if _prewarm is not None:
        return

    def warm() -> None:
        try:
            import torch._inductor  # noqa: F401

            from fuelpipe.plan.plan_cache_key import machine_digest

            machine_digest()
        except Exception:  # the build does the same and reports any failure itself
            pass

    _prewarm = threading.Thread(target=warm, name="fuelpipe-prewarm", daemon=True)
    _prewarm.start()


def _prewarmed() -> None:
    if _prewarm is not None:
        _prewarm.join()
