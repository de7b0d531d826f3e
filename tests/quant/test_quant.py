"""Low-bit weights (fuelpipe.quant, fuelpipe.kernels): kernels against the readable reference, lossless
use of a GGUF file's own blocks, the activation form, typed spec errors (whole models: test_quant_models.py)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from fuelpipe.kernels.build import load
from fuelpipe.errors import ConfigError
from fuelpipe.quant.formats import (
    ActivationForm, PackedWeight, QuantKind, QuantSpec, dequantize, pack_int4, quantize, quantize_activations,
    round_trip_activations, unpack_int4,
)
from fuelpipe.quant.gguf_blocks import packed_from_blocks
from fuelpipe.quant.modules import OP_SUFFIX, quantize_model
from models.registry import build_random_model

KINDS = [QuantKind.int8, QuantKind.int4, QuantKind.bf16]


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load()


def _op(p: PackedWeight, x, bias=None):
    ops = torch.ops.fuelpipe_kernels
    if p.kind is QuantKind.int8:
        return ops.q8_gemv(x, p.q, p.scales, bias)
    if p.kind is QuantKind.int4:
        return ops.q4_gemv(x, p.q, p.scales, p.mins, bias)
    return ops.bf16_gemv(x, p.q, bias)


def _op_integer(p: PackedWeight, x, bias=None, bits=16):
    """The integer-activation kernel of ``bits`` (16: *_a16, 8: *_a8)."""
    ops = torch.ops.fuelpipe_kernels
    tail = OP_SUFFIX[bits]
    if p.kind is QuantKind.int8:
        return getattr(ops, f"q8_gemv{tail}")(x, p.q, p.scales, bias)
    return getattr(ops, f"q4_gemv{tail}")(x, p.q, p.scales, p.mins, bias)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (96, 256, 64), (1536, 576, 32)])
@pytest.mark.parametrize("rows", [1, 3])
def test_kernel_equals_linear_over_the_dequantized_matrix(kind, n, k, group, rows):
    torch.manual_seed(n + k + rows)
    w = torch.randn(n, k)
    p = quantize(w, kind, group)
    x = torch.randn(2, rows, k)  # [B, T, K]: leading dims kept
    bias = torch.randn(n)
    want = F.linear(x, dequantize(p), bias)
    got = _op(p, x, bias)
    assert got.shape == (2, rows, n)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 2e-6 * scale * k ** 0.5


# ---- 16- and 8-bit activations (ActivationForm.int16 / int8): the *_a16 and *_a8 kernels -----------

INTEGER = [QuantKind.int8, QuantKind.int4]
A16_TOL = 2e-7  # x max|result| x sqrt(K): f32 addition order only (measured up to ~1e-6 relative at K=1536)
BITS = pytest.mark.parametrize("bits", [16, 8], ids=lambda b: f"a{b}")


@BITS
@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (96, 256, 64), (1536, 576, 32), (64, 1536, 128), (21, 160, 32)])
@pytest.mark.parametrize("rows", [1, 3])
def test_integer_activation_kernel_equals_linear_over_the_round_tripped_activations(kind, n, k, group, rows, bits):
    """The kernel computes F.linear(code * step, dequantize(w)): only the order of f32 additions differs."""
    torch.manual_seed(n + k + rows)
    p = quantize(torch.randn(n, k), kind, group)
    x, bias = torch.randn(2, rows, k), torch.randn(n)
    want = F.linear(round_trip_activations(x, bits), dequantize(p), bias)
    got = _op_integer(p, x, bias, bits)
    assert got.shape == (2, rows, n)
    assert float((got - want).abs().max()) <= A16_TOL * float(want.abs().max()) * k ** 0.5


@BITS
@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_negative_control_the_integer_activation_tolerance_sees_the_activation_rounding(kind, bits):
    """The tight comparison above must fail against f32 activations: it would catch a kernel that skips
    (or misplaces) the activation quantization."""
    torch.manual_seed(3)
    p = quantize(torch.randn(1536, 576), kind, 32)
    x = torch.randn(1, 576)
    f32 = F.linear(x, dequantize(p))
    assert float((_op_integer(p, x, None, bits) - f32).abs().max()) > A16_TOL * float(f32.abs().max()) * 576 ** 0.5


@BITS
@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_integer_activation_error_against_f32_activations_is_within_half_a_step_per_element(kind, bits):
    """|kernel - F.linear(x, W)| <= sum_k |W[n, k]| * step(k) / 2 (+ f32 rounding): the stated bound."""
    torch.manual_seed(5)
    p = quantize(torch.randn(256, 576), kind, 32)
    x = torch.randn(4, 576) * torch.logspace(-3, 2, 576)  # blocks of very different magnitudes
    w = dequantize(p)
    _, step = quantize_activations(x, bits)  # [4, 18]
    bound = (w.abs() @ (step.repeat_interleave(32, dim=-1) / 2).T).T  # [4, 256]
    err = (_op_integer(p, x, None, bits) - F.linear(x, w)).abs()
    assert bool((err <= bound * 1.01 + 1e-4 * F.linear(x.abs(), w.abs())).all())


@BITS
@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_integer_activation_row_does_not_depend_on_the_rows_beside_it(kind, bits):
    """A batch row equals the same row alone, bit for bit (batch_vs_solo relies on it)."""
    torch.manual_seed(7)
    p = quantize(torch.randn(300, 576), kind, 32)
    x = torch.randn(5, 576)
    many = _op_integer(p, x, None, bits)
    assert all(torch.equal(many[i], _op_integer(p, x[i : i + 1], None, bits)[0]) for i in range(5))


@pytest.mark.parametrize("bits,levels,dtype", [(16, 32767, torch.int16), (8, 127, torch.int8)])
def test_activation_codes_are_symmetric_with_zero_and_non_finite_blocks_handled(bits, levels, dtype):
    x = torch.randn(3, 96)
    x[1, :32] = 0.0  # an all-zero block: zero codes, zero step
    codes, step = quantize_activations(x, bits)
    assert codes.dtype == dtype and step.shape == (3, 3)
    assert int(codes.abs().max()) == levels and int(codes[1, :32].abs().max()) == 0 and float(step[1, 0]) == 0.0
    assert torch.equal(quantize_activations(-x, bits)[0], -codes)
    bad = x.clone()
    bad[2, 40] = float("inf")
    assert torch.isnan(quantize_activations(bad, bits)[1][2, 1])
    for kind in INTEGER:  # the NaN / inf reaches every output of that row, as with f32 activations
        p = quantize(torch.randn(16, 96), kind, 32)
        out = _op_integer(p, bad, None, bits)
        assert bool(torch.isnan(out[2]).all()) and bool(torch.isfinite(out[:2]).all())


def test_activations_quantize_to_16_or_8_bits_only():
    with pytest.raises(ConfigError, match="16 or 8 bits, got bits=4"):
        quantize_activations(torch.randn(1, 32), 4)


@BITS
@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_integer_activation_kernel_takes_f32_scales_too(kind, bits):
    p = quantize(torch.randn(64, 128), kind, 32)
    wide = PackedWeight(kind, p.q, p.scales.float(), None if p.mins is None else p.mins.float())
    x = torch.randn(1, 128)
    assert torch.allclose(_op_integer(wide, x, None, bits), _op_integer(p, x, None, bits), atol=1e-5)


@pytest.mark.parametrize("op", ["q8_gemv_a8", "q4_gemv_a8"])
def test_a8_kernels_refuse_bad_shapes_with_a_message_naming_the_operator(op):
    p = quantize(torch.randn(16, 64), QuantKind.int8 if op.startswith("q8") else QuantKind.int4, 32)
    ops = torch.ops.fuelpipe_kernels
    args = (p.q, p.scales) if op.startswith("q8") else (p.q, p.scales, p.mins)
    with pytest.raises(RuntimeError, match=f"{op}: x's last dimension must be in_features=64"):
        getattr(ops, op)(torch.randn(1, 63), *args, None)
    with pytest.raises(RuntimeError, match=f"{op}: x must be float32"):
        getattr(ops, op)(torch.randn(1, 64, dtype=torch.float64), *args, None)


def test_activation_form_resolves_per_kind_and_refuses_integer_activations_without_integer_weights():
    assert QuantSpec(QuantKind.int8).activations is ActivationForm.int16
    assert QuantSpec(QuantKind.int4, 32, "f32").activations is ActivationForm.f32
    assert QuantSpec(QuantKind.bf16).activations is ActivationForm.f32
    assert QuantSpec(QuantKind.int8).label() == "int8/g32/a16"
    assert QuantSpec(QuantKind.int4, 64, "int8").label() == "int4/g64/a8"
    assert QuantSpec(QuantKind.int8, 32, "f32").label() == "int8/g32"
    with pytest.raises(ConfigError, match="activations=int16 needs int8 or int4.*bf16"):
        QuantSpec(QuantKind.bf16, 32, "int16")
    with pytest.raises(ConfigError, match="activations=int8 needs int8 or int4.*f32"):
        QuantSpec(QuantKind.f32, 32, "int8")


@pytest.mark.parametrize("args, key, bad", [
    (("int3",), "weights.dtype", "'int3'"),
    ((QuantKind.int8, 32, "int12"), "weights.activations", "'int12'"),
    ((QuantKind.int8, "32"), "weights.group_size", "'32'"),
    ((QuantKind.int8, 48), "weights.group_size", "48"),
])
def test_a_bad_quant_spec_value_is_a_typed_error_naming_the_value_and_the_choices(args, key, bad):
    with pytest.raises(ConfigError) as err:
        QuantSpec(*args)
    message = str(err.value)
    assert key in message and bad in message
    if key == "weights.dtype":  # an enum names every choice
        assert all(k.value in message for k in QuantKind)
    if key == "weights.activations":
        assert all(a.value in message for a in ActivationForm)


@pytest.mark.parametrize("activations,op", [("int16", "q4_gemv_a16"), ("int8", "q4_gemv_a8"), ("f32", "q4_gemv")])
def test_quantized_modules_call_the_kernel_of_their_activation_form(activations, op, monkeypatch):
    model = build_random_model("llama", "tiny", seed=0)
    quantize_model(model, QuantSpec(QuantKind.int4, 32, activations))
    up = model.layers[0].mlp.up_proj
    assert up.activations is ActivationForm(activations)
    x = torch.randn(1, up.in_features)
    want = {"int16": lambda: _op_integer(up.packed(), x), "int8": lambda: _op_integer(up.packed(), x, None, 8),
            "f32": lambda: _op(up.packed(), x)}[activations]()
    assert torch.equal(up(x), want)
    assert activations in repr(up)


@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4])
def test_kernel_takes_f32_scales_too(kind):
    w, x = torch.randn(64, 128), torch.randn(1, 128)
    p = quantize(w, kind, 32)
    wide = PackedWeight(kind, p.q, p.scales.float(), None if p.mins is None else p.mins.float())
    assert torch.allclose(_op(wide, x), _op(p, x), atol=1e-5)


@pytest.mark.parametrize("kind,op", [(QuantKind.int4, _op), (QuantKind.int8, _op), (QuantKind.int4, _op_integer),
                                     (QuantKind.int8, _op_integer)], ids=["int4", "int8", "int4-a16", "int8-a16"])
def test_kernel_result_does_not_depend_on_the_thread_count(kind, op):
    w, x = torch.randn(512, 256), torch.randn(1, 256)
    p = quantize(w, kind, 32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op(p, x)
        torch.set_num_threads(2)
        two = op(p, x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_negative_control_a_wrong_scale_is_visible_to_the_kernel_test():
    w, x = torch.randn(64, 64), torch.randn(1, 64)
    p = quantize(w, QuantKind.int8, 32)
    bad = PackedWeight(p.kind, p.q, p.scales * 2, None)
    assert float((_op(bad, x) - F.linear(x, dequantize(p))).abs().max()) > 1e-2


@pytest.mark.parametrize("kind,bound", [(QuantKind.int8, 1 / 254), (QuantKind.int4, 1 / 30), (QuantKind.bf16, 2 ** -8)])
def test_quantize_error_is_within_half_a_step(kind, bound):
    w = torch.randn(64, 256)
    err = (dequantize(quantize(w, kind, 32)) - w).abs()
    groups = w.view(64, 8, 32)
    span = (groups.amax(-1) - groups.amin(-1)) if kind is QuantKind.int4 else groups.abs().amax(-1)
    allowed = span.repeat_interleave(32, dim=1) * bound * 1.05 + 1e-3 * (kind is not QuantKind.bf16)
    if kind is QuantKind.bf16:
        allowed = w.abs() * bound
    assert bool((err <= allowed).all())


def test_int4_packing_round_trips():
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)


@pytest.mark.parametrize("qtype,kind", [(Q.Q8_0, QuantKind.int8), (Q.Q4_1, QuantKind.int4), (Q.Q4_0, QuantKind.int4)])
def test_gguf_blocks_are_kept_as_they_are(qtype, kind):
    w = np.random.default_rng(0).normal(size=(6, 128)).astype(np.float32)
    raw = gguf_quantize(w, qtype)
    p = packed_from_blocks(raw, int(qtype), (6, 128), kind, 32)
    assert p is not None and p.kind is kind
    assert torch.equal(dequantize(p), torch.from_numpy(gguf_dequantize(raw, qtype)))


def test_q4_k_blocks_are_kept_exactly():
    rng = np.random.default_rng(1)
    block, size = GGML_QUANT_SIZES[Q.Q4_K]
    raw = rng.integers(0, 256, size=(4, 2 * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    blocks[:, 0:4] = rng.normal(size=(len(blocks), 2)).astype("<f2").view(np.uint8)
    p = packed_from_blocks(raw, int(Q.Q4_K), (4, 2 * block), QuantKind.int4, 32)
    assert torch.equal(dequantize(p), torch.from_numpy(gguf_dequantize(raw, Q.Q4_K)))


def test_blocks_of_another_group_size_or_kind_are_not_taken_as_they_are():
    raw = gguf_quantize(np.ones((2, 64), np.float32), Q.Q4_1)
    assert packed_from_blocks(raw, int(Q.Q4_1), (2, 64), QuantKind.int4, 64) is None
    assert packed_from_blocks(raw, int(Q.Q4_1), (2, 64), QuantKind.int8, 32) is None
