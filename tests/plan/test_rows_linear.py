"""The f32 kernel on the model's own weights (``fuelpipe.plan.rows_linear``) and weights that exist once.

The kernel must compute F.linear (up to summation order) for every shape, fused parts and row count;
its parts must read as their concatenation bit for bit; a batch row must be bit-identical to the row
alone and the thread count must not matter; bad input is refused naming the constraint. Its rotated
twin (the negative control's form) must permute the outputs. A plan whose linears take this form must
hold no copy of any weight (fused groups included), and a copying form is chosen only when it pays.
"""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faulty.fx_passes import (chain_linears_on_model_weights_rotated,
                                               run_linears_on_model_weights_rotated)
from fuelpipe.plan import derived_weights, linear_forms
from fuelpipe.plan.backends import BackendSpec, trace_step
from fuelpipe.plan.derived_weights import owned_bytes
from fuelpipe.plan.fx_passes import fuse_sibling_linears
from fuelpipe.plan.linear_forms import COPY_MIN_GAIN, FORMS, choose_forms, pick
from fuelpipe.plan.panels import kernels_available
from fuelpipe.plan.rows_linear import reference_rows_linear, rows_linear
from models.registry import build_random_model

pytestmark = pytest.mark.skipif(kernels_available() is not None, reason=f"kernels unavailable: {kernels_available()}")

SHAPES = [(33, 7), (16, 1), (64, 64), (4099, 48), (576, 576), (13, 29)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 13])
def test_the_kernel_computes_the_linear(n, k, rows):
    torch.manual_seed(n * 31 + k + rows)
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    torch.testing.assert_close(rows_linear(x, [w], b), F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)
    torch.testing.assert_close(rows_linear(x, [w]), F.linear(x, w), rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 16, 17, 33])
def test_the_prompt_recipe_computes_the_linear_with_the_panel_kernels_bits(n, k, rows):
    """chain=True: one sequential chain per output, the panel kernel's arithmetic, on the weights in place."""
    from fuelpipe.plan.panels import pack_panels, panel_linear

    torch.manual_seed(n * 7 + k + rows)
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    got = rows_linear(x, [w], b, chain=True)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert torch.equal(got, panel_linear(x, pack_panels(w), n, b))


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8, 20])
def test_parts_read_as_their_concatenation_bit_for_bit(rows, chain):
    """A fused group (q/k/v) on its parts where they lie equals the same kernel on the concatenated copy."""
    torch.manual_seed(rows)
    parts = [torch.randn(96, 80), torch.randn(32, 80), torch.randn(37, 80)]
    x, b = torch.randn(rows, 80), torch.randn(165)
    got = rows_linear(x, parts, b, chain=chain)
    assert got.shape == (rows, 165)
    assert torch.equal(got, rows_linear(x, [torch.cat(parts)], b, chain=chain))
    torch.testing.assert_close(got, reference_rows_linear(x, parts, b), rtol=1e-5, atol=1e-4)


def test_a_row_slice_of_a_wider_matrix_is_read_in_place():
    """Parts need unit stride along K only: a column block of a wider matrix has rows further apart."""
    big = torch.randn(40, 100)
    part = big[:, 10:74]  # [40, 64], row stride 100
    x = torch.randn(2, 64)
    assert torch.equal(rows_linear(x, [part]), rows_linear(x, [part.contiguous()]))


def test_leading_dimensions_are_kept():
    w, x = torch.randn(24, 16), torch.randn(2, 3, 16)
    assert rows_linear(x, [w]).shape == (2, 3, 24)
    assert rows_linear(torch.randn(0, 16), [w]).shape == (0, 24)


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("rows", [2, 3, 8, 13, 40])
def test_a_batch_row_is_bit_identical_to_the_row_alone(rows, chain):
    torch.manual_seed(rows)
    w, x = torch.randn(1000, 576), torch.randn(rows, 576)
    together = rows_linear(x, [w], chain=chain)
    for m in range(rows):
        assert torch.equal(together[m], rows_linear(x[m : m + 1], [w], chain=chain)[0])


@pytest.mark.parametrize("chain", [False, True])
def test_the_result_does_not_depend_on_the_thread_count(threads, chain):
    w, x = torch.randn(4099, 576), torch.randn(3, 576)
    threads(1)
    one = rows_linear(x, [w], chain=chain)
    threads(2)
    assert torch.equal(rows_linear(x, [w], chain=chain), one)


class One(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 48)

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize("rotated_pass", [run_linears_on_model_weights_rotated, chain_linears_on_model_weights_rotated])
def test_the_rotated_negative_control_permutes_the_outputs(rotated_pass):
    mod, x = One(), torch.randn(2, 64)
    gm = fx.symbolic_trace(mod)
    assert rotated_pass(gm) == 1
    got, want = gm(x), mod(x)
    assert not torch.allclose(got, want, atol=1e-3)
    # exactly a rotation of the outputs (the bias is added where the output lands)
    w = mod.lin.weight
    torch.testing.assert_close(got, F.linear(x, torch.cat([w[1:], w[:1]]), mod.lin.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad,message", [
    (lambda: rows_linear(torch.randn(1, 17), [torch.randn(8, 16)]), "x's last dimension must be in_features=16"),
    (lambda: rows_linear(torch.randn(1, 16), [torch.randn(8, 16), torch.randn(4, 15)]), r"weight 1 must be float32 \[N, 16\]"),
    (lambda: rows_linear(torch.randn(1, 16), [torch.randn(8, 16).double()]), "weight 0 must be float32"),
    (lambda: rows_linear(torch.randn(1, 16), [torch.randn(16, 8).t()]), "unit stride along in_features"),
    (lambda: rows_linear(torch.randn(1, 16), [torch.randn(8, 16)], torch.randn(9)), r"bias must be float32 \[8\]"),
    (lambda: rows_linear(torch.randn(1, 16).double(), [torch.randn(8, 16)]), "x must be float32"),
    (lambda: rows_linear(torch.randn(1, 16), []), "no weight matrices"),
])
def test_bad_input_is_refused_naming_the_constraint(bad, message):
    with pytest.raises(RuntimeError, match=message):
        bad()


def test_the_prompt_recipe_refuses_the_same_input():
    with pytest.raises(RuntimeError, match="f32_rows_chain_linear: x's last dimension must be in_features=16"):
        rows_linear(torch.randn(1, 17), [torch.randn(8, 16)], chain=True)


class Siblings(nn.Module):
    """q/k/v-like siblings reading one input, then a projection: the fusion pass's shape."""

    def __init__(self, bias: bool = False):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(256, 256, bias=bias), nn.Linear(256, 64, bias=bias), nn.Linear(256, 64, bias=bias)
        self.o = nn.Linear(384, 256, bias=bias)

    def forward(self, x):
        return self.o(torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1))


def _model_storages(mod: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in list(mod.parameters()) + list(mod.buffers())}


@pytest.mark.parametrize("bias", [False, True])
def test_a_fused_group_in_this_form_holds_no_copy_of_any_weight(bias):
    mod, x = Siblings(bias), torch.randn(3, 256)
    derived_weights.forget()
    gm, applied = trace_step(mod, ("fuse_sibling_linears", "run_linears_on_model_weights",
                                   "eliminate_dead_code_keeping_writes"))
    assert applied["fuse_sibling_linears"] == 1 and applied["run_linears_on_model_weights"] == 2
    weights = [t for name, t in gm.named_buffers() if name.startswith("form_weight")]
    assert len(weights) == 4  # q, k, v as parts, and o
    assert not owned_bytes(weights, _model_storages(mod))  # every one is the model's own tensor
    assert not [p for p in gm.parameters()]  # and no fused weight was made
    torch.testing.assert_close(gm(x), mod(x), rtol=1e-5, atol=1e-4)


def test_a_fused_group_no_pass_rewrites_gets_its_concatenated_weight():
    """Without a linear pass the fused module runs as F.linear: trace_step makes its weight after the passes."""
    mod, x = Siblings(True), torch.randn(2, 256)
    gm, _ = trace_step(mod, ("fuse_sibling_linears",))
    fused = [m for m in gm.modules() if type(m) is nn.Linear and m.out_features == 384]
    assert fused and not fused[0].weight.is_meta
    torch.testing.assert_close(gm(x), mod(x), rtol=1e-5, atol=1e-4)


def test_the_fusion_pass_alone_makes_no_weight():
    gm = fx.symbolic_trace(Siblings())
    assert fuse_sibling_linears(gm) == 1
    fused = [m for m in gm.modules() if type(m) is nn.Linear and m.out_features == 384]
    assert fused[0].weight.is_meta and linear_forms.is_lazy(fused[0])


# ---- choosing between copies and the model's own weights ------------------------------------------

def test_a_copy_is_chosen_only_when_it_pays():
    own = {"linear": 3.0, "rows": 1.0}
    slightly = dict(own, panels=1.0 - COPY_MIN_GAIN / 2)
    clearly = dict(own, panels=1.0 - 2 * COPY_MIN_GAIN)
    assert pick(slightly, ("panels",)) == "rows"
    assert pick(clearly, ("panels",)) == "panels"
    assert pick({"linear": 1.0, "panels": 0.5}, ("linear", "panels")) == "panels"  # no own form: fastest


def _timer(times: dict):
    return lambda form, lins, rows: times.get(form.name, 9.0)


def test_a_different_measurement_makes_a_different_choice_between_copy_and_own(threads):
    threads(2)
    lins = [nn.Linear(512, 1024, bias=False) for _ in range(2)]
    linear_forms.forget_choices()
    assert set(choose_forms(lins, 1, _timer({"rows": 1.0, "panels": 0.95}), allow_copies=True).values()) == {"rows"}
    assert set(choose_forms(lins, 1, _timer({"rows": 1.0, "panels": 0.5}), allow_copies=True).values()) == {"panels"}


def test_by_default_no_form_holding_a_copy_is_even_measured(threads):
    """``measured_linears`` (the default pass) weighs only forms on the model's own weights."""
    threads(2)
    linear_forms.forget_choices()
    timed: list = []

    def timer(form, lins, rows):
        timed.append(form.name)
        return {"panels": 0.1}.get(form.name, 1.0)

    lins = [nn.Linear(512, 1024, bias=False) for _ in range(2)]
    assert set(choose_forms(lins, 1, timer).values()) <= {"rows", "linear"}
    assert set(timed) == {"linear", "rows"}
    timed.clear()
    linear_forms.forget_choices()
    choose_forms(lins, 8, timer)
    assert set(timed) == {"linear", "rows", "rows_chain"}


def test_linear_on_a_fused_group_counts_as_a_copy():
    gm = fx.symbolic_trace(Siblings())
    fuse_sibling_linears(gm)
    fused = next(m for m in gm.modules() if type(m) is nn.Linear and m.out_features == 384)
    assert FORMS["linear"].copies(fused) and not FORMS["linear"].copies(nn.Linear(4, 4))
    assert not FORMS["rows"].copies(fused)


@pytest.mark.parametrize("backend", ["fx", "inductor"])
def test_a_plan_in_this_form_matches_eager_and_replan_is_bit_identical(backend, threads):
    threads(2)
    model = build_random_model("llama", "tiny", seed=5, hidden_size=512, intermediate_size=1024,
                               num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=1, vocab_size=4096)
    passes = ("fuse_sibling_linears", "run_linears_on_model_weights", "eliminate_dead_code_keeping_writes")
    outs = {}
    for plan in ("plan_once", "replan", "eager"):
        spec = "eager" if plan == "eager" else BackendSpec(backend, fx_passes=passes)
        ctx = InferenceContext(model, spec, "plan_once" if plan == "eager" else plan)
        cache = ctx.new_cache(16)
        ctx.prefill(cache, [1, 2, 3])
        outs[plan] = torch.stack([ctx.decode(cache, t)[0] for t in (4, 5, 6)])
        if plan == "plan_once":
            assert ctx.plan.session.program.passes_applied["run_linears_on_model_weights"] > 0
    assert torch.equal(outs["plan_once"], outs["replan"])
    torch.testing.assert_close(outs["plan_once"], outs["eager"], rtol=0, atol=1e-4)
