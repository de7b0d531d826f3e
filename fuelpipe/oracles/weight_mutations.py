"""Ways a user changes a model's weights under a held plan, each as one named function.

Every mutation changes the function the model computes (weights scaled by
``FACTOR``) through a different Python-level route; a held plan must notice
every one of them and rebuild. ``key_sensitivity`` runs them on private deep
copies, never on the model it was given.

* ``copy_``            in-place ``copy_`` under ``no_grad`` into every linear of the first layer
* ``data_assign``      ``weight.data = t`` on every linear (fused and split ones included)
* ``module_swap``      the first linear of the first layer replaced by a new ``nn.Linear``
* ``load_state_dict``  the whole state dict reloaded (copied in place) with other values
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

FACTOR = 1.25  # every mutated weight becomes FACTOR x itself: the function changes, the shapes do not


def linears(model: nn.Module) -> list[nn.Module]:
    """Every matrix-holding linear: ``nn.Linear`` and packed low-bit ones (``fuelpipe.quant``)."""
    from fuelpipe.quant.modules import QuantLinear

    return [m for m in model.modules() if type(m) is nn.Linear or isinstance(m, QuantLinear)]


def _packed(m: nn.Module) -> bool:
    return type(m) is not nn.Linear


def first_layer_linears(model: nn.Module) -> list[nn.Linear]:
    """The linears of the first decoder layer (``model.layers[0]``, else the model's first linear)."""
    layers = getattr(model, "layers", None)
    found = linears(layers[0]) if layers is not None and len(layers) else []
    return found or linears(model)[:1]


def scaled_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every floating tensor scaled (fresh tensors; the model is untouched)."""
    return {k: v * FACTOR if v.is_floating_point() else v.clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def copy_in_place(model: nn.Module) -> str:
    from fuelpipe.quant.modules import scale_packed_

    mods = first_layer_linears(model)
    for m in mods:
        if _packed(m):
            scale_packed_(m, FACTOR)
        else:
            m.weight.copy_(m.weight * FACTOR)
    return f"copy_ into {len(mods)} linear weights of the first layer"


@torch.no_grad()
def data_assign(model: nn.Module) -> str:
    from fuelpipe.quant.modules import scale_packed_

    mods = linears(model)
    for m in mods:
        if _packed(m):
            scale_packed_(m, FACTOR, via_data=True)
        else:
            m.weight.data = m.weight.detach() * FACTOR
    return f".data = on {len(mods)} linear weights"


@torch.no_grad()
def module_swap(model: nn.Module) -> str:
    old = first_layer_linears(model)[0]
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old and _packed(old):
                from fuelpipe.quant.modules import scaled_copy

                setattr(parent, name, scaled_copy(old, FACTOR))
                return f"module {type(parent).__name__}.{name} replaced by a new {type(old).__name__}"
            if child is old:
                new = nn.Linear(old.in_features, old.out_features, bias=old.bias is not None,
                                device=old.weight.device, dtype=old.weight.dtype).requires_grad_(False)
                new.weight.copy_(old.weight * FACTOR)
                if old.bias is not None:
                    new.bias.copy_(old.bias)
                setattr(parent, name, new)
                return f"module {type(parent).__name__}.{name} replaced by a new nn.Linear"
    raise LookupError("module_swap: the first linear has no parent module")  # unreachable for a module tree


def reload_state(model: nn.Module) -> str:
    model.load_state_dict(scaled_state(model))
    return "load_state_dict with other values"


MUTATIONS: dict[str, Callable[[nn.Module], str]] = {
    "copy_": copy_in_place,
    "data_assign": data_assign,
    "module_swap": module_swap,
    "load_state_dict": reload_state,
}
