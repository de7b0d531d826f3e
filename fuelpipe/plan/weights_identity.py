"""A held plan's weight identity, read from the tensors the model holds, on every step.

A plan bakes weights: eager and fx hold the model's modules, fx and inductor
also hold build-time copies (fused q/k/v and gate/up, transposed split
layouts). So a plan is valid only for the exact tensors it read when it was
built, in the state they were in. That is read here from the module tree
itself, not from bookkeeping a Python-level mutation can bypass:

* every submodule object (``attn.k_proj = nn.Linear(...)`` replaces one);
* every parameter and buffer object (``module.weight = nn.Parameter(...)``,
  ``load_state_dict(assign=True)``, a ``copy.deepcopy`` of the whole model);
* the storage each one points at (``param.data = t`` keeps the object and
  swaps the storage; so does ``.to()``);
* each tensor's in-place version counter (``copy_``, ``load_state_dict``,
  any in-place op under ``no_grad``).

Ids and addresses are only meaningful while the objects they name are alive,
or a freed object's id/address could be handed to a newcomer. A plan
therefore pins what it read (``WeightsPin``): the modules, the tensors and an
alias of each storage, for as long as the plan is held.

Not seen: a write through ``param.data`` (``param.data.copy_(t)``): ``.data``
is a detached alias with a version counter of its own, so nothing on the
parameter moves. Use ``copy_`` under ``torch.no_grad()`` or ``load_state_dict``
(both seen), or drop the plan (``ctx.plan.drop()``).

Cost: one pass over the tree's dicts in C (``map``/``chain``) plus a pointer
and a version read per tensor: ~0.1 ms per step for SmolLM2-135M's 273
tensors (see tests/bench).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import torch
from torch import nn


@dataclass(frozen=True)
class WeightsIdentity:
    """The model's weight-bearing objects and their state; equal means the same weights, unchanged."""

    modules: tuple[int, ...]  # id() of every submodule, tree order
    tensors: tuple[int, ...]  # id() of every parameter and buffer object
    storages: tuple[int, ...]  # data_ptr() of each tensor
    versions: tuple[int, ...]  # in-place version counter of each tensor
    names: tuple[str, ...] = field(default=(), compare=False)  # dotted names, for messages only

    def __str__(self) -> str:
        return f"weights({len(self.modules)} modules, {len(self.tensors)} tensors, {sum(self.versions)} writes)"

    def changes(self, live: "WeightsIdentity") -> list[str]:
        """What moved between this (held) identity and ``live``: replaced, re-pointed or written tensors."""
        if self.modules != live.modules:
            return ["a submodule was replaced, added or removed"]
        if self.tensors != live.tensors:
            return [f"tensor object replaced: {n}" for n in _differing(self.names, self.tensors, live.tensors)] or [
                "the set of parameters/buffers changed"
            ]
        out = [f"storage swapped (.data = / .to()): {n}" for n in _differing(self.names, self.storages, live.storages)]
        out += [f"written in place: {n}" for n in _differing(self.names, self.versions, live.versions)]
        return out


def _differing(names, held, live) -> list[str]:
    if len(held) != len(live):
        return []
    return [names[i] if i < len(names) else f"#{i}" for i, (a, b) in enumerate(zip(held, live)) if a != b]


class _TreeWatch:
    """The flattened dicts of one model's module tree, re-walked only when the tree itself changes."""

    def __init__(self, model: nn.Module) -> None:
        self._model = weakref.ref(model)
        self._walk(model)

    def _walk(self, model: nn.Module) -> None:
        named = list(model.named_modules(remove_duplicate=True))
        self.modules = [m for _, m in named]
        self.module_dicts = [m._modules for m in self.modules]
        self.tensor_dicts = [d for m in self.modules for d in (m._parameters, m._buffers)]
        self.tensor_names = [
            f"{prefix}.{name}" if prefix else name
            for prefix, m in named
            for d in (m._parameters, m._buffers)
            for name, t in d.items()
            if t is not None
        ]
        self.module_ids = self._module_ids()

    def _module_ids(self) -> tuple[int, ...]:
        return tuple(map(id, chain.from_iterable(map(dict.values, self.module_dicts))))

    def read(self) -> tuple[WeightsIdentity, list[nn.Module], list[torch.Tensor]]:
        if self._module_ids() != self.module_ids:  # a submodule was swapped: walk the new tree
            self._walk(self._model())
        tensors = [t for t in chain.from_iterable(map(dict.values, self.tensor_dicts)) if t is not None]
        identity = WeightsIdentity(
            modules=self.module_ids,
            tensors=tuple(map(id, tensors)),
            storages=tuple([t.data_ptr() for t in tensors]),
            versions=tuple([t._version for t in tensors]),
            names=tuple(self.tensor_names) if len(self.tensor_names) == len(tensors) else (),
        )
        return identity, self.modules, tensors


_watches: "weakref.WeakKeyDictionary[nn.Module, _TreeWatch]" = weakref.WeakKeyDictionary()
_watch_lock = threading.Lock()


def _watch(model: nn.Module) -> _TreeWatch:
    with _watch_lock:
        w = _watches.get(model)
        if w is None:
            w = _watches[model] = _TreeWatch(model)
        return w


def weights_identity(model: nn.Module) -> WeightsIdentity:
    """The live weight identity of ``model`` (cheap enough to read every step)."""
    return _watch(model).read()[0]


@dataclass(frozen=True)
class WeightsPin:
    """Keeps alive everything a held plan's ``WeightsIdentity`` names, so no id or address is recycled."""

    identity: WeightsIdentity
    modules: tuple[nn.Module, ...]
    tensors: tuple[torch.Tensor, ...]
    storages: tuple[torch.Tensor, ...]  # detached aliases: the storages as they were at build

    @classmethod
    def of(cls, model: nn.Module) -> "WeightsPin":
        identity, modules, tensors = _watch(model).read()
        return cls(identity, tuple(modules), tuple(tensors), tuple(t.detach() for t in tensors))


def pin_weights(model: nn.Module) -> Optional[WeightsPin]:
    return WeightsPin.of(model) if isinstance(model, nn.Module) else None
