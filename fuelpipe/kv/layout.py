"""KV layouts as registered strategies: each owns its caches, what it serves, and its step signatures.

A ``KvLayout`` is found by name, like a family. Built-in layouts (and any new one
added to this package) are the ``KV_LAYOUT`` objects of the modules of
``fuelpipe.kv``; an installed package adds one through the ``fuelpipe.kv_layouts``
entry-point group, a notebook through ``register_layout``. A layout answers:

* ``serves(model)``: why it cannot serve a model (empty: it can); ``check_serves`` refuses on it;
* ``check_cache(model, cache)``: refuse, typed, a cache of its kind built for another geometry;
* ``new_cache`` / ``new_batch``: one sequence's cache, or a batch cache of several;
* ``signature(offset_mode, batched=, packed=)``: the ``StepSignature`` of the step that decodes from
  its caches: the program's inputs (in order), whether it takes host integers, and the per-layer
  KV views. The one generic ``fuelpipe.step.Step`` is built from a signature.

Every cache names its layout (``cache.kv_layout``) and whether it is a batch cache (``cache.batched``).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from fuelpipe.errors import ConfigError
from fuelpipe.registry import OWN_DISTRIBUTION, Registry, Source

# The inputs every step takes first, and the per-pass host integers (compiled with symbolic sizes).
COMMON_INPUTS = ("token_ids", "rope_cos", "rope_sin", "mask")
HOST_INTS = ("cached_len", "attended_len")
KNOWN_INPUTS = HOST_INTS + ("write_index", "block_table", "slot_ids", "last_index")

# (backbone, named inputs of one call, the bound KV list) -> one KV view per layer
ViewFactory = Callable[[Any, dict, list], list]


@dataclass(frozen=True)
class StepSignature:
    """One step program's input signature: ``token_ids, rope_cos, rope_sin, mask, *inputs, kv``.

    ``name`` keys plan caches and reports (``tensor``, ``paged_symbol``, ``ring`` ...); ``inputs`` are
    read from the step buffers, or from the host data for ``cached_len`` / ``attended_len``; a packed
    step (several prompts in one row) takes ``last_index`` and returns one logits row per prompt.
    """

    name: str
    inputs: tuple[str, ...]
    views: ViewFactory

    def __post_init__(self) -> None:
        unknown = [n for n in self.inputs if n not in KNOWN_INPUTS]
        if unknown or len(set(self.inputs)) != len(self.inputs):
            raise ConfigError(f"step signature {self.name!r}: inputs must be distinct names of {list(KNOWN_INPUTS)}, "
                              f"got {list(self.inputs)}")

    @property
    def symbolic(self) -> bool:
        """Takes per-pass host integers: compiled with symbolic sizes, never stored ahead of time."""
        return any(n in HOST_INTS for n in self.inputs)

    @property
    def packed(self) -> bool:
        return "last_index" in self.inputs

    def arguments(self, buffers, host, kv: list) -> tuple:
        """The program's positional arguments for one call, in this signature's order."""
        named = tuple(getattr(host, n) if n in HOST_INTS else getattr(buffers, n) for n in self.inputs)
        return (buffers.token_ids, buffers.rope_cos, buffers.rope_sin, buffers.mask) + named + (kv,)


class KvLayout:
    """Base of a registered KV layout (subclasses are frozen dataclasses with their own options)."""

    name: ClassVar[str] = ""
    for_mla: ClassVar[bool] = False  # serves MLA families (latent slots) only; every other layout serves the rest

    def signatures(self) -> Sequence[StepSignature]:
        """Every step signature this layout can hand out (how a signature is found by its name)."""
        raise NotImplementedError

    def signature(self, offset_mode: str, *, batched: bool = False, packed: bool = False) -> StepSignature:
        raise NotImplementedError

    def serves(self, model) -> list[str]:
        """Why this layout cannot serve ``model`` (empty: it can)."""
        return []

    def check_serves(self, model) -> None:
        """Refuse (``ConfigError``, naming every reason) a ``model`` this layout cannot serve."""
        reasons = self.serves(model)
        if reasons:
            family = getattr(model, "family", type(model).__name__)
            raise ConfigError(f"kv={self.name} cannot serve {family}: " + "; ".join(reasons))

    def check_cache(self, model, cache) -> None:
        """Refuse (``ConfigError``) a cache of this layout that ``model`` cannot decode from."""
        self.check_serves(model)

    def new_cache(self, ctx, spec, max_seq_len: int):
        raise NotImplementedError

    def new_batch(self, ctx, spec, max_batch: int, max_seq_len: int):
        raise ConfigError(f"kv={self.name} has no batch cache")


class _LayoutRegistry(Registry):
    """The entry-point registry plus the ``KV_LAYOUT`` of every module of ``fuelpipe.kv``."""

    def _load(self) -> None:
        if self._loaded:
            return
        super()._load()
        try:
            import fuelpipe.kv as package

            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
                module = importlib.import_module(f"fuelpipe.kv.{info.name}")
                entry = getattr(module, "KV_LAYOUT", None)
                if entry is not None:
                    self._add(entry, Source(OWN_DISTRIBUTION, f"fuelpipe.kv.{info.name}:KV_LAYOUT"))
        except BaseException:
            self._entries, self._loaded = {}, False
            raise


KV_LAYOUTS: Registry[KvLayout] = _LayoutRegistry("fuelpipe.kv_layouts", "kv layout", KvLayout, required=False)


def register_layout(layout: KvLayout) -> KvLayout:
    return KV_LAYOUTS.register(layout)


def layout_named(name: str) -> KvLayout:
    return KV_LAYOUTS.get(name)


def layout_names() -> tuple[str, ...]:
    return KV_LAYOUTS.names()


def layout_of(cache) -> KvLayout:
    """The layout a cache (or a batch cache, or a bucket's view of one) belongs to."""
    name = getattr(cache, "kv_layout", None)
    if not isinstance(name, str):
        raise ConfigError(f"{type(cache).__name__} is not a KV cache of a registered layout (no kv_layout name); "
                          f"layouts: {', '.join(layout_names())}")
    return layout_named(name)


def signature_for(cache, offset_mode: str, *, packed: bool = False) -> StepSignature:
    """The signature of the step that decodes from ``cache`` on ``offset_mode``'s path."""
    return layout_of(cache).signature(offset_mode, batched=bool(getattr(cache, "batched", False)), packed=packed)


def signature_named(name: str) -> StepSignature:
    """A step signature by its name, from whichever registered layout hands it out."""
    for _, layout in KV_LAYOUTS.items():
        for sig in layout.signatures():
            if sig.name == name:
                return sig
    known = sorted({s.name for _, lay in KV_LAYOUTS.items() for s in lay.signatures()})
    raise ConfigError(f"unknown step signature {name!r}; available: {', '.join(known)}")
