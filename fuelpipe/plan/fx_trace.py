"""Tracing a step into an fx GraphModule without a process-wide cost that grows with every plan built.

fuelpipe's fx leaves (``torch.fx.wrap``: ``last_positions``, ``slot_attention``) stay single call
nodes in a traced graph. By default fx also writes a ``wrap("name")`` statement into the generated
code of every GraphModule holding such a node, and running that code (each ``recompile``, so every
pass that rewrites the graph) registers the new module's globals in fx's process-wide table of
functions to patch. Nothing ever removes an entry, and every later trace patches all of them: a
process that builds plans (a test session, a sweep, a benchmark's replan arm) slowed down
quadratically, measured at ~1,700 entries and ~45 ms of patching per trace after two smoke jobs.

Our graphs are never traced again from their generated code (passes rewrite the graph itself), so
the leaf marker is dropped before the GraphModule is made: its code registers nothing, and the leaf
nodes are unchanged.

Each node traced inside ``backbone.apply_layer(i, ...)`` is tagged with its layer
(``node.meta[LAYER_TAG] = i``); nodes traced before the first layer are tagged ``PROLOGUE`` and after
the last ``EPILOGUE``. ``fuelpipe.plan.layer_segments`` cuts the optimised graph at those tags, so a
build can compile one program per distinct layer shape instead of one per layer.
"""
from __future__ import annotations

import contextlib

import torch.fx as fx
from torch import nn

LAYER_TAG = "fuelpipe_layer"
PROLOGUE = -1
EPILOGUE = 1 << 30  # after every layer, whatever the depth


class _LayerTaggingTracer(fx.Tracer):
    """An fx tracer that tags every node it creates with the layer being traced."""

    layer: int = PROLOGUE

    def create_node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta[LAYER_TAG] = self.layer
        return node


@contextlib.contextmanager
def _tagging_layers(step: nn.Module, tracer: _LayerTaggingTracer):
    """While tracing, ``step.backbone.apply_layer`` sets the tracer's layer around each call."""
    backbone = getattr(step, "backbone", None)
    apply_layer = getattr(backbone, "apply_layer", None)
    if apply_layer is None:
        yield
        return

    def tagged(index, *args, **kwargs):
        tracer.layer = index
        try:
            return apply_layer(index, *args, **kwargs)
        finally:
            tracer.layer = EPILOGUE  # the next layer's call sets its own

    object.__setattr__(backbone, "apply_layer", tagged)  # an instance attribute shadows the method
    try:
        yield
    finally:
        object.__delattr__(backbone, "apply_layer")


def trace_leaves_unregistered(step: nn.Module) -> fx.GraphModule:
    """``fx.symbolic_trace(step)``, but the generated code holds no ``wrap(...)`` registration, and
    each node carries its layer tag (``LAYER_TAG``)."""
    tracer = _LayerTaggingTracer()
    with _tagging_layers(step, tracer):
        graph = tracer.trace(step)
    for node in graph.nodes:
        node.meta.pop("is_wrapped", None)
    return fx.GraphModule(tracer.root, graph, step.__class__.__name__)
