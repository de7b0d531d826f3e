"""One build per generation under plan_once, one per token under replan; realize_count and node count."""
import pytest

from conftest import PROMPT
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.plan.validity import PlanValidity


@pytest.mark.parametrize("offset_mode", ["tensor", "symbol"])
def test_plan_once_builds_once_and_counts_every_reuse(tiny_llama, offset_mode):
    ctx = InferenceContext(tiny_llama, "fx", "plan_once", offset_mode=offset_mode)
    cache = ctx.new_cache(64)
    logits = ctx.prefill(cache, PROMPT)
    counts, nodes = [], []
    for step in range(20):
        logits = ctx.decode(cache, int(logits.argmax()))
        counts.append(ctx.plan.session.realize_count)
        nodes.append(ctx.plan.session.node_count)
    assert ctx.plan.stats.builds == 1
    assert counts == list(range(20))  # 0 right after the build, +1 per reused token
    assert nodes[0] is not None and len(set(nodes[1:])) == 1 and nodes[1] == nodes[0]
    assert ctx.plan.stats.last_validity is PlanValidity.VALID


def test_replan_builds_every_token_and_holds_nothing(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx", "replan")
    result = ctx.generate(PROMPT, 12)
    assert ctx.plan.stats.builds == 11  # every decode token (the 12th token comes from the 11th step)
    assert ctx.plan.session is None


def test_default_call_shape_is_the_fast_one(tiny_llama):
    """A user writing the obvious loop gets plan reuse without asking for it."""
    ctx = InferenceContext(tiny_llama)
    ctx.generate(PROMPT, 10)
    assert ctx.plan.stats.builds == 1 and ctx.plan.session.realize_count == 8


def test_negative_control_over_keying_is_visible_in_accounting(tiny_llama):
    ctx = InferenceContext(tiny_llama, "fx", "plan_once", policy=policy_for(Fault.REBUILD_EVERY_TOKEN))
    ctx.generate(PROMPT, 10)
    assert ctx.plan.stats.builds == 9  # the accounting check (builds == 1) would fail
