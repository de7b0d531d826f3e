"""An optimised step graph cut into per-layer programs, so that layers of one shape share one compile.

A decoder's layers run the same code on weights of the same shapes. Compiling the whole step ahead of
time (``backend=aot``) compiles every layer again: SmolLM2's 30 layers made a 2,100-node graph and a
45-second build. Here the graph the passes produced is cut at its layer tags (``fuelpipe.plan.fx_trace``)
into:

* the **prologue**: the embedding, and every value that depends only on the step's inputs (the KV
  tensors picked from the list, RoPE rows and masks sliced per layer, anything a layer memoised for
  the others); it runs as fx code;
* one **segment per layer**: a function of the values it reads from outside (the residual stream,
  its RoPE rows, mask, write index and KV tensors) and of its weights, every weight lifted to an
  argument (``state``); segments whose canonical code and argument shapes are equal share one
  ``signature``, so one compiled program serves all of them;
* the **epilogue**: the final norm and the head, as fx code.

``cut`` refuses (``NotSegmentable``, with the reason) any graph it cannot cut faithfully: a value that
is not a tensor crossing a cut, or a node reading a later layer's value. The caller then compiles the
whole graph. ``assemble`` rebuilds the step as fx code calling one program per layer.
"""
from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from fuelpipe.plan.fx_passes import is_inplace
from fuelpipe.plan.fx_trace import EPILOGUE, LAYER_TAG, PROLOGUE

FREE = "free"  # depends on the step's inputs and weights only


class NotSegmentable(Exception):
    """The graph cannot be cut into per-layer programs; the message says why."""


@dataclass
class Segment:
    """One layer's part of the step, as a function of ``inputs`` (outside values) and ``state`` (its weights)."""

    layer: int
    nodes: list[fx.Node]
    inputs: list[fx.Node]  # values computed outside the segment, in order of first use
    outputs: list[fx.Node]  # its values read outside it
    module: fx.GraphModule  # canonical names: in0.., v0.., state w0.. and m0.. (submodules)
    state: list[torch.Tensor] = field(default_factory=list)  # the module's parameters and buffers, in order
    state_names: list[str] = field(default_factory=list)
    signature: str = ""  # equal signatures: one compiled program serves both

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.signature.encode()).hexdigest()


@dataclass
class Cut:
    segments: list[Segment]
    tags: dict[fx.Node, int]


def record_values(gm: fx.GraphModule, args: tuple) -> dict[fx.Node, Any]:
    """Every node's value for one run of ``gm`` on ``args`` (a decode step: it writes the same KV the real
    step then writes again)."""
    values: dict[fx.Node, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            values[n] = out
            return out

    _Recorder(gm, garbage_collect_values=False).run(*args)
    return values


def _inputs_of(node: fx.Node) -> list[fx.Node]:
    return list(node.all_input_nodes)


def assign_tags(gm: fx.GraphModule, values: dict[fx.Node, Any]) -> dict[fx.Node, int]:
    """Each node's place: PROLOGUE, a layer index or EPILOGUE (weights: FREE, read where they are used).

    A traced node keeps the layer it was traced in; a node a pass made goes with the latest layer it
    reads, or, reading none, with the earliest place that reads it. A value that depends on the step's
    inputs and weights only and is read by several layers (a mask's live slots, computed once for all)
    moves to the prologue, with what it reads."""
    nodes = list(gm.graph.nodes)
    tags: dict[fx.Node, Any] = {}
    free: dict[fx.Node, bool] = {}
    for node in nodes:
        ins = _inputs_of(node)
        free[node] = node.op in ("placeholder", "get_attr") or node.op != "output" and all(free[i] for i in ins)
        if node.op == "get_attr":
            tags[node] = FREE
        elif node.op == "placeholder":
            tags[node] = PROLOGUE
        elif node.op == "output":
            tags[node] = EPILOGUE
        elif node.meta.get(LAYER_TAG) is not None:
            tags[node] = node.meta[LAYER_TAG]
        else:  # made by a pass
            placed = [tags[i] for i in ins if tags[i] not in (FREE, PROLOGUE)]
            tags[node] = max(placed) if placed else None
    for node in reversed(nodes):
        if tags[node] is None:
            users = [tags[u] for u in node.users]
            if not users:
                raise NotSegmentable(f"{node.format_node()} (made by a pass) reads no layer value and has no user")
            tags[node] = min(users)
    for node in nodes:  # what several places read, computed once before them
        if node.op in ("placeholder", "get_attr", "output") or not free[node] or tags[node] == PROLOGUE:
            continue
        if len({tags[u] for u in node.users}) > 1:
            _to_prologue(node, tags, free, values)
    return tags


def _to_prologue(node: fx.Node, tags: dict, free: dict, values: dict) -> None:
    if tags[node] in (PROLOGUE, FREE):
        return
    if is_inplace(node):
        raise NotSegmentable(f"{node.format_node()} writes in place and is read by several layers")
    if not isinstance(values.get(node), torch.Tensor):
        raise NotSegmentable(f"{node.format_node()} is no tensor and is read by several layers")
    tags[node] = PROLOGUE
    for i in _inputs_of(node):
        if free[i] and i.op not in ("placeholder", "get_attr"):
            _to_prologue(i, tags, free, values)


def cut(gm: fx.GraphModule, values: dict[fx.Node, Any], n_layers: int) -> Cut:
    tags = assign_tags(gm, values)
    by_layer: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        tag = tags[node]
        if node.op == "get_attr":
            continue
        for i in _inputs_of(node):
            ti = tags[i]
            if ti != FREE and ti > tag:
                raise NotSegmentable(f"{node.format_node()} (place {tag}) reads {i.name} from a later place {ti}")
        if isinstance(tag, int) and 0 <= tag < n_layers:
            by_layer.setdefault(tag, []).append(node)
    if sorted(by_layer) != list(range(n_layers)):
        raise NotSegmentable(f"layers found {sorted(by_layer)[:8]}..., expected 0..{n_layers - 1}")
    segments = [_segment(gm, layer, nodes, tags, values) for layer, nodes in sorted(by_layer.items())]
    return Cut(segments, tags)


def _segment(gm: fx.GraphModule, layer: int, nodes: list[fx.Node], tags: dict, values: dict) -> Segment:
    inside = set(nodes)
    inputs: list[fx.Node] = []
    for node in nodes:
        for i in _inputs_of(node):
            if i not in inside and i.op != "get_attr" and i not in inputs:
                if not isinstance(values.get(i), torch.Tensor):
                    raise NotSegmentable(f"layer {layer} reads {i.name}, which is no tensor "
                                         f"({type(values.get(i)).__name__})")
                inputs.append(i)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    for o in outputs:
        if not isinstance(values.get(o), torch.Tensor):
            raise NotSegmentable(f"layer {layer} hands out {o.name}, which is no tensor")
    module, state_names, described = _canonical_module(gm, nodes, inputs, outputs, values)
    named = {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}
    state = [named[name] for name in state_names]
    metas = [input_class(values[i]) for i in inputs] + [weight_class(t) for t in state]
    signature = "\n".join([module.code, *described, *map(repr, metas), f"outputs {len(outputs)}"])
    return Segment(layer, nodes, inputs, outputs, module, [t.detach() for t in state], state_names, signature)


def input_class(t: torch.Tensor) -> tuple:
    """What a program compiled for a contiguous input ``t`` depends on: its dtype, device, rank and which
    dims are 1. Its other sizes (the KV capacity, a batch bucket) are compiled as symbols
    (``fuelpipe.plan.layer_programs``), so one program serves them all; any the code fixes are checked
    before a program is used. A strided view is keyed, and compiled, at its exact sizes and strides."""
    if t.is_contiguous():
        return ("contiguous", str(t.dtype), str(t.device), tuple(1 if d == 1 else "n" for d in t.shape))
    return ("strided",) + _meta(t)


def weight_class(t: torch.Tensor) -> tuple:
    """A weight's exact shape and strides: programs are compiled with the weights' sizes fixed, so layers of
    the same code but other widths are other signatures (other programs)."""
    return ("weight",) + _meta(t)


def _meta(t: torch.Tensor) -> tuple:
    # not the storage offset or the address: the compiled code takes the data pointer and loads unaligned
    return (tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))


def _canonical_module(gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node],
                      values: dict) -> tuple[fx.GraphModule, list[str], list[str]]:
    """The segment as a GraphModule whose names depend only on its structure (so equal layers print equal code)."""
    graph = fx.Graph()
    root = nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    described: list[str] = []
    for k, i in enumerate(inputs):
        env[i] = graph.placeholder(f"in{k}")
    attrs: dict[str, str] = {}  # the original target -> canonical name
    counter = iter(range(1 << 30))

    def lookup(a: fx.Node) -> fx.Node:
        if a in env:
            return env[a]
        if a.op == "get_attr":  # a weight: a buffer of the segment's module
            name = attrs.get(a.target)
            if name is None:
                name = attrs[a.target] = f"w{len(attrs)}"
                root.register_buffer(name, _attr(gm, a.target).detach())
            env[a] = graph.create_node("get_attr", name, name=f"v{next(counter)}")
            return env[a]
        raise NotSegmentable(f"{a.name} is read inside a layer but computed nowhere before it")

    for node in nodes:
        args = fx.node.map_arg(node.args, lookup)
        kwargs = fx.node.map_arg(node.kwargs, lookup)
        target = node.target
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            target = f"m{len(root._modules)}"
            root.add_module(target, mod)
            described.append(f"{target}: {type(mod).__module__}.{type(mod).__qualname__}({mod.extra_repr()})")
        elif node.op == "call_function":
            described.append(f"fn {getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}")
        env[node] = graph.create_node(node.op, target, args, kwargs, name=f"v{next(counter)}")
    graph.output(tuple(env[o] for o in outputs))
    module = fx.GraphModule(root, graph, "LayerSegment")
    names = [n for n, _ in module.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in module.named_buffers(remove_duplicate=False)]
    return module, names, described


def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, torch.Tensor):
        raise NotSegmentable(f"weight {target} is a {type(obj).__name__}, not a tensor")
    return obj


def assemble(gm: fx.GraphModule, the_cut: Cut, layer_calls: list[nn.Module]) -> fx.GraphModule:
    """The step as fx code: the prologue, one call per layer (``layer_calls[i]`` takes the segment's inputs
    and returns its outputs as a tuple), the epilogue."""
    tags = the_cut.tags
    graph = fx.Graph()
    root = nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    in_layers = {n for s in the_cut.segments for n in s.nodes}

    def copy(node: fx.Node) -> None:
        if node.op == "get_attr":
            name = f"attr_{len(root._buffers)}"
            root.register_buffer(name, _attr(gm, node.target))
            env[node] = graph.get_attr(name)
            return
        if node.op == "call_module":
            name = f"mod_{len(root._modules)}"
            root.add_module(name, gm.get_submodule(node.target))
            env[node] = graph.call_module(name, fx.node.map_arg(node.args, lambda a: _need(a)),
                                          fx.node.map_arg(node.kwargs, lambda a: _need(a)))
            return
        env[node] = graph.node_copy(node, _need)

    def _need(a: fx.Node) -> fx.Node:
        if a not in env:
            copy(a)  # a weight read outside the layers, copied where first needed
        return env[a]

    body = [n for n in gm.graph.nodes if n.op != "get_attr"]
    for node in body:  # the prologue: inputs, and what depends on them only
        if node not in in_layers and node.op != "output" and tags[node] == PROLOGUE:
            copy(node)
    for segment, call in zip(the_cut.segments, layer_calls):  # called as plain functions: no module hooks
        result = graph.call_function(call.forward, tuple(_need(i) for i in segment.inputs))
        for k, out in enumerate(segment.outputs):
            env[out] = graph.call_function(operator.getitem, (result, k))
    for node in body:  # the epilogue
        if node not in in_layers and node.op != "output" and tags[node] != PROLOGUE:
            copy(node)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    graph.output(fx.node.map_arg(output.args[0], _need))
    step = fx.GraphModule(root, graph, "LayeredStep")
    for segment, call in zip(the_cut.segments, layer_calls):  # held by the step too, for inspection
        step.add_module(f"layer_{segment.layer}", call)
    return step


def group_by_signature(segments: list[Segment]) -> dict[str, list[Segment]]:
    groups: dict[str, list[Segment]] = {}
    for s in segments:
        groups.setdefault(s.signature, []).append(s)
    return groups

