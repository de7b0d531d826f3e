"""Thread-split GEMVs compute F.linear, and the pass applies where it should (and nowhere else)."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from fuelpipe.context import InferenceContext
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.fx_passes import fuse_sibling_linears, split_linears_across_threads
from fuelpipe.plan.split_gemv import (
    MIN_SPLIT_ELEMENTS,
    WIDE_RATIO,
    reference_linear,
    split_gemv,
    split_weight,
    worth_splitting,
)
from fuelpipe.step import step_module_for
from models.registry import build_random_model

# The split pass explicitly (the default lets the measured pass choose among the forms).
SPLIT = BackendSpec("fx", ("fuse_sibling_linears", "split_linears_across_threads", "eliminate_dead_code_keeping_writes"))


@pytest.fixture(scope="module")
def wide_llama():
    """One layer with every projection at or above the split threshold (gate/up fused: the cols layout)."""
    return build_random_model(
        "llama", "tiny", seed=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
        num_key_value_heads=4, num_hidden_layers=1, vocab_size=1024,
    )


@pytest.fixture
def threads():
    """Set torch's intra-op threads for one test, restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("n,k", [(24, 4), (16, 4), (12, 4), (8, 12), (12, 12)])  # wide, boundary (n == 4k), rows
@pytest.mark.parametrize("lead", [(1, 1), (1, 5), (3,)])  # one decode token, a prefill block, a flat batch
@pytest.mark.parametrize("with_bias", [False, True])
def test_split_gemv_equals_linear(parts, n, k, lead, with_bias):
    g = torch.Generator().manual_seed(n * 100 + k)
    weight, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g) if with_bias else None
    x = torch.randn(*lead, k, generator=g)
    w, cols = split_weight(weight, parts)
    assert cols == (n >= WIDE_RATIO * k)
    out = split_gemv(x, w, bias, cols)
    assert out.shape == (*lead, n)
    torch.testing.assert_close(out, reference_linear(x, weight, bias), atol=1e-5, rtol=1e-5)


def test_rows_layout_is_a_view_and_cols_a_copy():
    tall = torch.randn(8, 6)
    w, cols = split_weight(tall, 2)
    assert not cols and w.data_ptr() == tall.data_ptr()
    wide = torch.randn(32, 4)
    w, cols = split_weight(wide, 2)
    assert cols and w.data_ptr() != wide.data_ptr()


@pytest.mark.parametrize("fault", ["layout flag flipped", "parts swapped"])
def test_negative_control_a_mis_split_weight_is_caught(fault):
    """The equality check above can fail: a wrongly split weight gives a different answer."""
    weight, x = torch.randn(24, 4), torch.randn(1, 1, 4)
    w, cols = split_weight(weight, 2)
    if fault == "layout flag flipped":
        w, cols = w.reshape(2, 12, 4).contiguous(), not cols  # same numbers, read as the other layout
    else:
        w = w.flip(0).contiguous()  # part 1's rows where part 0's belong
    out = split_gemv(x, w, None, cols)
    assert (out - F.linear(x, weight)).abs().max() > 1e-3


def linear_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.Linear)]


def step_logits(model, program):
    ctx = InferenceContext(model, "eager")
    cache = ctx.new_cache(16)
    host = ctx._host(cache, torch.tensor([[5, 6, 7]]))
    return program(host.token_ids, host.rope_cos, host.rope_sin, host.mask, host.write_index, cache.bound_tensors())


def test_pass_splits_every_large_linear_and_keeps_logits(wide_llama, threads):
    threads(2)
    step = step_module_for(wide_llama, "tensor")
    gm = fx.symbolic_trace(step)
    fuse_sibling_linears(gm)
    n_linear = len(linear_nodes(gm))  # fused qkv, o, fused gate/up, down, head
    assert n_linear == 5
    assert split_linears_across_threads(gm) == n_linear
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.fuelpipe.split_gemv.default) == n_linear
    assert not [name for name, _ in gm.named_children() if name.startswith("fused_linear")]  # copies dropped
    torch.testing.assert_close(step_logits(wide_llama, gm), step_logits(wide_llama, step), atol=1e-5, rtol=0)


def test_pass_leaves_small_matrices_alone(tiny_llama, threads):
    threads(2)
    gm = fx.symbolic_trace(step_module_for(tiny_llama, "tensor"))
    assert all(m.weight.numel() < MIN_SPLIT_ELEMENTS for m in tiny_llama.modules() if isinstance(m, torch.nn.Linear))
    assert split_linears_across_threads(gm) == 0
    assert not worth_splitting(torch.empty(MIN_SPLIT_ELEMENTS // 64 - 2, 64), 2)
    assert worth_splitting(torch.empty(MIN_SPLIT_ELEMENTS // 64, 64), 2)


def test_pass_is_a_no_op_on_one_thread(wide_llama, threads):
    threads(1)
    gm = fx.symbolic_trace(step_module_for(wide_llama, "tensor"))
    assert split_linears_across_threads(gm) == 0


def test_a_plan_split_for_two_threads_computes_the_same_on_one(wide_llama, threads):
    """The part count is fixed at build; running on another thread count changes speed, not the answer."""
    threads(2)
    ctx = InferenceContext(wide_llama, SPLIT)
    cache = ctx.new_cache(16)
    ctx.prefill(cache, [1, 2, 3])
    ctx.decode(cache, 4)
    assert ctx.plan.session.program.passes_applied["split_linears_across_threads"] == 5
    threads(1)
    ref = InferenceContext(wide_llama, "eager")
    ref_cache = ref.new_cache(16)
    ref.prefill(ref_cache, [1, 2, 3])
    ref.decode(ref_cache, 4)
    torch.testing.assert_close(ctx.decode(cache, 9), ref.decode(ref_cache, 9), atol=1e-5, rtol=0)
    assert ctx.plan.stats.builds == 1


def test_in_place_weight_update_rebuilds_a_plan_holding_split_copies(wide_llama, threads):
    """The head's cols layout is a copy: an in-place update must not be served from the stale copy."""
    threads(2)
    model = build_random_model(
        "llama", "tiny", seed=3, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
        num_key_value_heads=4, num_hidden_layers=1, vocab_size=4096,
    )
    ctx = InferenceContext(model, SPLIT)
    cache = ctx.new_cache(16)
    ctx.prefill(cache, [1, 2, 3])
    ctx.decode(cache, 4)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    out = ctx.decode(cache, 5)
    assert ctx.plan.stats.builds == 2
    ref = InferenceContext(model, "eager")
    ref_cache = ref.new_cache(16)
    ref.prefill(ref_cache, [1, 2, 3])
    ref.decode(ref_cache, 4)
    torch.testing.assert_close(out, ref.decode(ref_cache, 5), atol=1e-4, rtol=0)


def test_pass_leaves_linears_whose_outputs_do_not_divide(threads):
    threads(2)

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.even, self.odd = torch.nn.Linear(512, 1024), torch.nn.Linear(512, 1023)

        def forward(self, x):
            return self.even(x).sum() + self.odd(x).sum()

    gm = fx.symbolic_trace(Odd())
    assert split_linears_across_threads(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["odd"]


def test_plan_once_with_the_split_is_bit_identical_to_replan(wide_llama, threads):
    threads(2)
    outs = []
    for plan in ("plan_once", "replan"):
        ctx = InferenceContext(wide_llama, SPLIT, plan)
        cache = ctx.new_cache(16)
        ctx.prefill(cache, [1, 2, 3])
        outs.append(torch.stack([ctx.decode(cache, t)[0] for t in (4, 5, 6)]))
    assert torch.equal(outs[0], outs[1])
    assert InferenceContext(wide_llama, SPLIT).plan.spec.fx_passes.count("split_linears_across_threads") == 1
