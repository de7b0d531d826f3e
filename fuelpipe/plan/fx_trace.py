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
"""
from __future__ import annotations

import torch.fx as fx
from torch import nn


def trace_leaves_unregistered(step: nn.Module) -> fx.GraphModule:
    """``fx.symbolic_trace(step)``, but the generated code holds no ``wrap(...)`` registration."""
    tracer = fx.Tracer()
    graph = tracer.trace(step)
    for node in graph.nodes:
        node.meta.pop("is_wrapped", None)
    return fx.GraphModule(tracer.root, graph, step.__class__.__name__)
