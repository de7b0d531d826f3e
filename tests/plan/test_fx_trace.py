"""Building plans leaves no process-wide fx state behind: plan N+1 traces as fast as plan 1."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.fx._symbolic_trace as fx_internals
from torch import nn

from fuelpipe.plan.backends import trace_step
from fuelpipe.plan.fx_trace import trace_leaves_unregistered
from fuelpipe import step as step_module
from fuelpipe.step import last_positions

PASSES = ("fuse_sibling_linears", "eliminate_dead_code_keeping_writes")


class HeadOverLast(nn.Module):
    """Siblings over every position, then a head over each sequence's last position (an fx leaf)."""

    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(32, 32), nn.Linear(32, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, h):  # h [B, T, 32]
        # called through its module, whose globals fx patches while tracing
        return self.head(step_module.last_positions(self.q(h) + self.k(h), None))  # [B, 1, 10]


def _table_size() -> int:
    table = getattr(fx_internals, "_wrapped_fns_to_patch", None)
    if table is None:
        pytest.skip("this torch keeps no table of wrapped functions")
    return len(table)


def test_the_leaf_stays_one_node_and_the_code_registers_nothing():
    gm = trace_leaves_unregistered(HeadOverLast())
    leaves = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is last_positions]
    assert len(leaves) == 1  # still a leaf: passes can find it
    assert "wrap(" not in gm.code
    h = torch.randn(2, 5, 32)
    torch.testing.assert_close(gm(h), _eager(gm, h))


def _eager(gm: fx.GraphModule, h: torch.Tensor) -> torch.Tensor:
    return gm.head((gm.q(h) + gm.k(h))[:, -1:, :])


def test_building_plans_does_not_grow_fx_patch_table():
    mod = HeadOverLast()
    trace_step(mod, PASSES)  # anything imported on first use registers now
    before = _table_size()
    for _ in range(5):
        trace_step(mod, PASSES)
    assert _table_size() == before


def test_negative_control_plain_symbolic_trace_grows_the_table():
    """What the guarded trace avoids: fx's own trace plus one recompile register two entries per plan."""
    before = _table_size()
    for _ in range(3):
        gm = fx.symbolic_trace(HeadOverLast())
        gm.recompile()
    assert _table_size() >= before + 6
