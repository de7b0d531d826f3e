"""The f32 panel kernel and the measured choice of how each linear runs.

The kernel must compute F.linear (up to summation order) for every shape, give a batch row
bit-identical to the same row alone and results independent of the thread count; its
mis-packed twin (the negative control's form) must permute the outputs. The measured pass must
choose by measurement: a different measurement gives a different choice, and a choice is made
once per shape, row count and thread count.
"""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faulty.fx_passes import pack_linears_into_panels_misordered, pack_panels_misordered
from fuelpipe.plan import linear_forms
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.fx_passes import pack_linears_into_panels
from fuelpipe.plan.linear_forms import FORMS, choose_forms, measured_linears
from fuelpipe.plan.panels import PANEL, pack_panels, panel_linear, unpack_panels
from models.registry import build_random_model

SHAPES = [(33, 7), (16, 1), (64, 64), (4099, 48), (576, 576)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_packing_round_trips_and_pads_with_zeros(n, k):
    w = torch.randn(n, k)
    panels = pack_panels(w)
    assert panels.shape == (-(-n // PANEL), k, PANEL) and panels.is_contiguous()
    assert torch.equal(unpack_panels(panels, n), w)
    assert not panels.transpose(1, 2).reshape(-1, k)[n:].any()  # the tail panel's padding is zero


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13])
def test_the_kernel_computes_the_linear(n, k, rows):
    torch.manual_seed(n * 31 + k + rows)
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    got = panel_linear(x, pack_panels(w), n, b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("rows", [1, 8])
def test_panels_off_a_32_byte_boundary_give_the_same_result(rows):
    """A stored AOTInductor plan holds the panels as package constants, not always 32-byte aligned."""
    w, x = torch.randn(96, 64), torch.randn(rows, 64)
    panels = pack_panels(w)
    backing = torch.empty(panels.numel() + 4)
    shifted = backing[1 : 1 + panels.numel()].view(panels.shape)  # 4 bytes past an aligned start
    shifted.copy_(panels)
    assert shifted.data_ptr() % 32 != 0
    assert torch.equal(panel_linear(x, shifted, 96), panel_linear(x, panels, 96))


def test_leading_dimensions_are_kept():
    w, x = torch.randn(40, 24), torch.randn(2, 3, 24)
    got = panel_linear(x, pack_panels(w), 40)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [2, 6, 8, 16])
def test_a_batch_row_is_bit_identical_to_the_row_alone(rows):
    w, x = torch.randn(600, 1536), torch.randn(rows, 1536)
    panels = pack_panels(w)
    together = panel_linear(x, panels, 600)
    alone = torch.cat([panel_linear(x[i:i + 1], panels, 600) for i in range(rows)])
    assert torch.equal(together, alone)


def test_the_result_does_not_depend_on_the_thread_count(threads):
    w, x = torch.randn(4096, 576), torch.randn(3, 576)
    panels = pack_panels(w)
    threads(1)
    one = panel_linear(x, panels, 4096)
    threads(2)
    assert torch.equal(panel_linear(x, panels, 4096), one)


def test_the_misordered_packing_permutes_the_outputs():
    """The negative control's form: the same numbers, each group of 16 columns reversed."""
    w, x = torch.randn(64, 32), torch.randn(1, 32)
    right = panel_linear(x, pack_panels(w), 64)
    wrong = panel_linear(x, pack_panels_misordered(w), 64)
    assert not torch.allclose(wrong, right)
    torch.testing.assert_close(wrong.view(1, 4, 16).flip(-1).reshape(1, 64), right)


@pytest.mark.parametrize("bad,message", [
    (lambda w: pack_panels(w).double(), "panels must be contiguous float32"),
    (lambda w: pack_panels(w).transpose(1, 2), "panels must be contiguous float32"),
])
def test_malformed_panels_are_refused_with_the_constraint(bad, message):
    w = torch.randn(32, 16)
    with pytest.raises(RuntimeError, match=message):
        panel_linear(torch.randn(1, 16), bad(w), 32)


def test_a_wrong_width_or_out_features_is_refused():
    panels = pack_panels(torch.randn(32, 16))
    with pytest.raises(RuntimeError, match="in_features=16"):
        panel_linear(torch.randn(1, 17), panels, 32)
    with pytest.raises(RuntimeError, match="out_features=40 does not fit 2 panels"):
        panel_linear(torch.randn(1, 16), panels, 40)


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(48, 100), nn.Linear(100, 37, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("rows", [1, 4])
def test_the_panel_pass_rewrites_every_linear_and_keeps_the_function(rows):
    mod, x = TwoLinears(), torch.randn(rows, 48)
    gm = fx.symbolic_trace(mod)
    assert pack_linears_into_panels(gm) == 2
    assert not [n for n in gm.graph.nodes if n.op == "call_module"]
    torch.testing.assert_close(gm(x), mod(x), rtol=1e-5, atol=1e-5)
    wrong = fx.symbolic_trace(mod)
    pack_linears_into_panels_misordered(wrong)
    assert not torch.allclose(wrong(x), mod(x), atol=1e-3)


def _timer_preferring(name: str, calls: list):
    def timer(form, lins, rows):
        calls.append((form.name, lins[0].weight.shape, rows))
        return 1.0 if form.name == name else 2.0
    return timer


def test_a_different_measurement_makes_a_different_choice(threads):
    """The choice follows what the timer measured on this CPU, not a table: flip the timing, flip the choice."""
    threads(2)
    lins = [nn.Linear(512, 1024, bias=False) for _ in range(3)]
    linear_forms.forget_choices()
    calls: list = []
    prefer_split = _timer_preferring("split_gemv", calls)
    prefer_panels = _timer_preferring("panels", calls)
    assert set(choose_forms(lins, 1, prefer_split, allow_copies=True).values()) == {"split_gemv"}
    assert set(choose_forms(lins, 1, prefer_panels, allow_copies=True).values()) == {"panels"}
    timed = {name for name, _, _ in calls}
    assert timed == {"linear", "split_gemv", "panels", "rows"}  # every usable form was measured
    # Several rows: the split GEMV does not apply, the transposed GEMM does.
    assert set(choose_forms(lins, 8, _timer_preferring("gemm_transposed", []), allow_copies=True).values()) == {
        "gemm_transposed"}


def test_a_choice_is_measured_once_per_shape_rows_and_threads(threads):
    threads(2)
    linear_forms.forget_choices()
    calls: list = []
    timer = _timer_preferring("panels", calls)
    lins = [nn.Linear(512, 1024, bias=False), nn.Linear(512, 1024, bias=False), nn.Linear(1024, 512, bias=False)]
    choose_forms(lins, 1, timer, allow_copies=True)
    first = len(calls)
    assert first == 2 * 4  # two shape classes x four usable forms
    choose_forms(lins, 1, timer, allow_copies=True)
    assert len(calls) == first  # cached: a replan build measures nothing
    choose_forms(lins, 2, timer, allow_copies=True)
    assert len(calls) > first  # another row count is measured afresh


class TwoBigLinears(TwoLinears):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(48, 8192), nn.Linear(8192, 40, bias=False)


def test_the_measured_pass_uses_the_chosen_form(threads):
    threads(2)
    linear_forms.forget_choices()
    mod, x = TwoBigLinears(), torch.randn(1, 48)
    gm = fx.symbolic_trace(mod)
    assert measured_linears(gm, 1, _timer_preferring("panels", []), allow_copies=True) == 2
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.fuelpipe_kernels.f32_panel_linear.default in ops
    torch.testing.assert_close(gm(x), mod(x), rtol=1e-5, atol=1e-5)
    gm = fx.symbolic_trace(mod)
    assert measured_linears(gm, 1, _timer_preferring("linear", [])) == 0  # F.linear kept as traced


def test_small_linears_stay_unmeasured_so_every_process_builds_the_same_plan(threads):
    """A microsecond timing is noise: below MEASURE_MIN_ELEMENTS the choice is F.linear, measured never."""
    threads(2)
    linear_forms.forget_choices()
    calls: list = []
    gm = fx.symbolic_trace(TwoLinears())
    assert measured_linears(gm, 1, _timer_preferring("panels", calls)) == 0 and not calls


def test_the_panel_copy_of_a_weight_is_shared_by_every_plan():
    """Bucket plans of one batch (and plan_once / replan builds) hold one packed copy per weight."""
    lin = nn.Linear(64, 64)
    assert FORMS["panels"].weight(lin)[0] is FORMS["panels"].weight(lin)[0]


@pytest.mark.parametrize("backend", ["fx", "inductor"])
def test_a_default_plan_matches_eager_and_replan_is_bit_identical(backend, threads):
    """The default (measured) plan on a model big enough for every form: plan_once == replan, both ~ eager."""
    threads(2)
    model = build_random_model("llama", "tiny", seed=5, hidden_size=512, intermediate_size=1024,
                               num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=1, vocab_size=4096)
    outs = {}
    for plan in ("plan_once", "replan", "eager"):
        ctx = InferenceContext(model, "eager" if plan == "eager" else BackendSpec(backend),
                               "plan_once" if plan == "eager" else plan)
        cache = ctx.new_cache(16)
        ctx.prefill(cache, [1, 2, 3])
        outs[plan] = torch.stack([ctx.decode(cache, t)[0] for t in (4, 5, 6)])
        if plan == "plan_once":
            assert "measured_linears" in ctx.plan.session.program.passes_applied
    assert torch.equal(outs["plan_once"], outs["replan"])
    torch.testing.assert_close(outs["plan_once"], outs["eager"], rtol=0, atol=1e-4)
