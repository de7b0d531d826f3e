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

Cost: a fetch of every (dict, key) entry, a pointer and a version read per
tensor, each a C-level ``map``; measured on SmolLM2-135M (365 modules, 273
tensors) in the closing note of the change that introduced it.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Optional

import torch
from torch import nn


@dataclass(frozen=True)
class WeightsIdentity:
    """The model's weight-bearing objects and their state; equal means the same weights, unchanged."""

    objects: tuple[int, ...]  # id() of every submodule, then of every parameter and buffer, tree order
    storages: tuple[int, ...]  # data_ptr() of each tensor
    versions: tuple[int, ...]  # in-place version counter of each tensor
    names: tuple[str, ...] = field(default=(), compare=False)  # each tensor's dotted name, for messages only

    def __str__(self) -> str:
        return f"weights({len(self.storages)} tensors, {sum(self.versions)} writes)"

    def changes(self, live: "WeightsIdentity") -> list[str]:
        """What moved between this (held) identity and ``live``: replaced, re-pointed or written tensors."""
        if self.objects != live.objects:
            if len(self.objects) == len(live.objects) and len(self.storages) == len(live.storages):
                n_mod = len(self.objects) - len(self.storages)
                if self.objects[:n_mod] == live.objects[:n_mod]:
                    return [f"tensor object replaced: {n}"
                            for n in _differing(self.names, self.objects[n_mod:], live.objects[n_mod:])]
            return ["a submodule was replaced, added or removed"]
        out = [f"storage swapped (.data = / .to()): {n}" for n in _differing(self.names, self.storages, live.storages)]
        out += [f"written in place: {n}" for n in _differing(self.names, self.versions, live.versions)]
        return out


def _differing(names, held, live) -> list[str]:
    if len(held) != len(live):
        return []
    return [names[i] if i < len(names) else f"#{i}" for i, (a, b) in enumerate(zip(held, live)) if a != b]


_version_of = attrgetter("_version")


class _TreeWatch:
    """Every (dict, key) of one model's tree that holds a submodule or a tensor, read in C each step.

    ``map(dict.get, dicts, keys)`` fetches what each entry holds now, so a replaced
    module or tensor shows as another object id; the tree is re-walked only then.
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = weakref.ref(model)
        self._walk(model)

    def _walk(self, model: nn.Module) -> None:
        named = list(model.named_modules(remove_duplicate=True))
        module_entries = [(m._modules, k) for _, m in named for k, v in m._modules.items() if v is not None]
        tensor_entries = [(d, k) for _, m in named for d in (m._parameters, m._buffers)
                          for k, t in d.items() if t is not None]
        self.names = tuple(f"{p}.{k}" if p else k for p, m in named for d in (m._parameters, m._buffers)
                           for k, t in d.items() if t is not None)
        self.n_modules = len(module_entries)
        entries = module_entries + tensor_entries
        self.dicts = [d for d, _ in entries]
        self.keys = [k for _, k in entries]
        self.objects = list(map(dict.get, self.dicts, self.keys))
        self.ids = tuple(map(id, self.objects))

    def read(self) -> tuple[WeightsIdentity, list]:
        objects = list(map(dict.get, self.dicts, self.keys))
        ids = tuple(map(id, objects))
        if ids != self.ids:  # a module or tensor was replaced: walk the tree as it is now
            self._walk(self._model())
            objects, ids = self.objects, self.ids
        tensors = objects[self.n_modules:]
        identity = WeightsIdentity(
            objects=ids,
            storages=tuple(map(torch.Tensor.data_ptr, tensors)),
            versions=tuple(map(_version_of, tensors)),
            names=self.names,
        )
        return identity, objects


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
    objects: tuple[object, ...]  # the submodules and tensors whose ids the identity holds
    storages: tuple[torch.Tensor, ...]  # detached aliases: the storages as they were at build

    @classmethod
    def of(cls, model: nn.Module) -> "WeightsPin":
        identity, objects = _watch(model).read()
        tensors = [o for o in objects if isinstance(o, torch.Tensor)]
        return cls(identity, tuple(objects), tuple(t.detach() for t in tensors))


def pin_weights(model: nn.Module) -> Optional[WeightsPin]:
    return WeightsPin.of(model) if isinstance(model, nn.Module) else None
