"""Replace the linear calls of a traced step by chosen forms (``fuelpipe.plan.linear_forms.LinearForm``).

Each rewritten call reads its weight (or a fused group's parts) and bias from
buffers registered on the graph module, so a plan holds exactly the tensors
its forms read; the call itself is whatever the form emits.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch.fx as fx
from torch import nn

if TYPE_CHECKING:
    from fuelpipe.plan.linear_forms import LinearForm


def linear_of(gm: fx.GraphModule, node: fx.Node) -> Optional[nn.Linear]:
    """The plain ``nn.Linear`` a ``call_module`` node runs with one positional input, or None."""
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
        return None
    mod = gm.get_submodule(node.target)
    return mod if type(mod) is nn.Linear else None


def rewrite(gm: fx.GraphModule, node: fx.Node, lin: nn.Linear, form: LinearForm, index: int) -> None:
    """Replace the linear call ``node`` by ``form``'s call; its weight copy becomes a buffer of ``gm``."""
    if form.emit is None:  # F.linear: the traced call already is this form
        return
    w = form.weight(lin)
    weight, static = w if isinstance(w, tuple) else (w, None)
    with gm.graph.inserting_before(node):
        b_node = None
        if lin.bias is not None:
            gm.register_buffer(f"form_bias_{index}", lin.bias.detach())
            b_node = gm.graph.get_attr(f"form_bias_{index}")
        if isinstance(weight, list):  # several tensors (a fused group's parts): one buffer each
            for j, part in enumerate(weight):
                gm.register_buffer(f"form_weight_{index}_{j}", part)
            w_node = [gm.graph.get_attr(f"form_weight_{index}_{j}") for j in range(len(weight))]
        else:
            gm.register_buffer(f"form_weight_{index}", weight)
            w_node = gm.graph.get_attr(f"form_weight_{index}")
        out = form.emit(gm.graph, node.args[0], w_node, static, b_node)
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)


def rewrite_all(gm: fx.GraphModule, choose: Callable[[nn.Linear], Optional[LinearForm]]) -> int:
    """Rewrite every linear for which ``choose`` names a form other than ``linear``. Returns how many."""
    done, index = 0, _first_free_index(gm)
    for node in list(gm.graph.nodes):
        lin = linear_of(gm, node)
        form = choose(lin) if lin is not None else None
        if form is None or form.emit is None:
            continue
        rewrite(gm, node, lin, form, index)
        done, index = done + 1, index + 1
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return done


def _first_free_index(gm: fx.GraphModule) -> int:
    """The first index no earlier rewrite of ``gm`` used for its buffers."""
    i = 0
    while hasattr(gm, f"form_weight_{i}") or hasattr(gm, f"form_weight_{i}_0") or hasattr(gm, f"form_bias_{i}"):
        i += 1
    return i
