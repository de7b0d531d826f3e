"""Low-bit weights (fuelpipe.quant, fuelpipe.kernels): kernels against the readable reference, lossless
use of a GGUF file's own blocks, the plan key, the quality oracle and its negative control, config errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from conftest import with_tiny_model
from fuelpipe.faults import Fault
from fuelpipe.kernels.build import load
from fuelpipe.oracles.execute import execute
from fuelpipe.oracles.registry import oracle
from fuelpipe.errors import ConfigError
from fuelpipe.quant.formats import (
    ActivationForm, PackedWeight, QuantKind, QuantSpec, dequantize, pack_int4, quantize, quantize_activations,
    round_trip_activations, unpack_int4,
)
from fuelpipe.quant.gguf_blocks import packed_from_blocks
from fuelpipe.quant.modules import QuantEmbedding, QuantLinear, quantize_model
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


def _op_a16(p: PackedWeight, x, bias=None):
    ops = torch.ops.fuelpipe_kernels
    if p.kind is QuantKind.int8:
        return ops.q8_gemv_a16(x, p.q, p.scales, bias)
    return ops.q4_gemv_a16(x, p.q, p.scales, p.mins, bias)


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


# ---- 16-bit activations (ActivationForm.int16): the *_a16 kernels ----------------------------------

INTEGER = [QuantKind.int8, QuantKind.int4]
A16_TOL = 2e-7  # x max|result| x sqrt(K): f32 addition order only (measured up to ~1e-6 relative at K=1536)


@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
@pytest.mark.parametrize("n,k,group", [(37, 64, 32), (96, 256, 64), (1536, 576, 32), (64, 1536, 128)])
@pytest.mark.parametrize("rows", [1, 3])
def test_a16_kernel_equals_linear_over_the_round_tripped_activations(kind, n, k, group, rows):
    """The kernel computes F.linear(code * step, dequantize(w)): only the order of f32 additions differs."""
    torch.manual_seed(n + k + rows)
    p = quantize(torch.randn(n, k), kind, group)
    x, bias = torch.randn(2, rows, k), torch.randn(n)
    want = F.linear(round_trip_activations(x), dequantize(p), bias)
    got = _op_a16(p, x, bias)
    assert got.shape == (2, rows, n)
    assert float((got - want).abs().max()) <= A16_TOL * float(want.abs().max()) * k ** 0.5


@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_negative_control_the_a16_tolerance_sees_the_activation_rounding(kind):
    """The tight comparison above must fail against f32 activations: it would catch a kernel that skips
    (or misplaces) the activation quantization."""
    torch.manual_seed(3)
    p = quantize(torch.randn(1536, 576), kind, 32)
    x = torch.randn(1, 576)
    f32 = F.linear(x, dequantize(p))
    assert float((_op_a16(p, x) - f32).abs().max()) > A16_TOL * float(f32.abs().max()) * 576 ** 0.5


@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_a16_error_against_f32_activations_is_within_half_a_step_per_element(kind):
    """|kernel - F.linear(x, W)| <= sum_k |W[n, k]| * step(k) / 2 (+ f32 rounding): the stated bound."""
    torch.manual_seed(5)
    p = quantize(torch.randn(256, 576), kind, 32)
    x = torch.randn(4, 576) * torch.logspace(-3, 2, 576)  # blocks of very different magnitudes
    w = dequantize(p)
    _, step = quantize_activations(x)  # [4, 18]
    bound = (w.abs() @ (step.repeat_interleave(32, dim=-1) / 2).T).T  # [4, 256]
    err = (_op_a16(p, x) - F.linear(x, w)).abs()
    assert bool((err <= bound * 1.01 + 1e-4 * F.linear(x.abs(), w.abs())).all())


@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_a16_row_does_not_depend_on_the_rows_beside_it(kind):
    """A batch row equals the same row alone, bit for bit (batch_vs_solo relies on it)."""
    torch.manual_seed(7)
    p = quantize(torch.randn(300, 576), kind, 32)
    x = torch.randn(5, 576)
    many = _op_a16(p, x)
    assert all(torch.equal(many[i], _op_a16(p, x[i : i + 1])[0]) for i in range(5))


def test_activation_codes_are_symmetric_16_bit_with_zero_and_non_finite_blocks_handled():
    x = torch.randn(3, 96)
    x[1, :32] = 0.0  # an all-zero block: zero codes, zero step
    codes, step = quantize_activations(x)
    assert codes.dtype == torch.int16 and step.shape == (3, 3)
    assert int(codes.abs().max()) == 32767 and int(codes[1, :32].abs().max()) == 0 and float(step[1, 0]) == 0.0
    assert torch.equal(quantize_activations(-x)[0], -codes)
    bad = x.clone()
    bad[2, 40] = float("inf")
    assert torch.isnan(quantize_activations(bad)[1][2, 1])
    for kind in INTEGER:  # the NaN / inf reaches every output of that row, as with f32 activations
        p = quantize(torch.randn(16, 96), kind, 32)
        out = _op_a16(p, bad)
        assert bool(torch.isnan(out[2]).all()) and bool(torch.isfinite(out[:2]).all())


@pytest.mark.parametrize("kind", INTEGER, ids=lambda k: k.value)
def test_a16_kernel_takes_f32_scales_too(kind):
    p = quantize(torch.randn(64, 128), kind, 32)
    wide = PackedWeight(kind, p.q, p.scales.float(), None if p.mins is None else p.mins.float())
    x = torch.randn(1, 128)
    assert torch.allclose(_op_a16(wide, x), _op_a16(p, x), atol=1e-5)


def test_activation_form_resolves_per_kind_and_refuses_int16_without_integer_weights():
    assert QuantSpec(QuantKind.int8).activations is ActivationForm.int16
    assert QuantSpec(QuantKind.int4, 32, "f32").activations is ActivationForm.f32
    assert QuantSpec(QuantKind.bf16).activations is ActivationForm.f32
    assert QuantSpec(QuantKind.int8).label() == "int8/g32/a16"
    assert QuantSpec(QuantKind.int8, 32, "f32").label() == "int8/g32"
    with pytest.raises(ConfigError, match="activations=int16 needs int8 or int4.*bf16"):
        QuantSpec(QuantKind.bf16, 32, "int16")


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


@pytest.mark.parametrize("activations,op", [("int16", "q4_gemv_a16"), ("f32", "q4_gemv")])
def test_quantized_modules_call_the_kernel_of_their_activation_form(activations, op, monkeypatch):
    model = build_random_model("llama", "tiny", seed=0)
    quantize_model(model, QuantSpec(QuantKind.int4, 32, activations))
    up = model.layers[0].mlp.up_proj
    assert up.activations is ActivationForm(activations)
    x = torch.randn(1, up.in_features)
    want = _op_a16(up.packed(), x) if activations == "int16" else _op(up.packed(), x)
    assert torch.equal(up(x), want)
    assert activations in repr(up)


def test_the_activation_form_is_part_of_the_plan_key():
    a = _tiny(QuantKind.int8)
    b = build_random_model("llama", "tiny", seed=0)
    quantize_model(b, QuantSpec(QuantKind.int8, 32, "f32"))
    assert a.structure()["weight_format"] != b.structure()["weight_format"]
    assert a.shape_key() != b.shape_key()


@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4])
def test_kernel_takes_f32_scales_too(kind):
    w, x = torch.randn(64, 128), torch.randn(1, 128)
    p = quantize(w, kind, 32)
    wide = PackedWeight(kind, p.q, p.scales.float(), None if p.mins is None else p.mins.float())
    assert torch.allclose(_op(wide, x), _op(p, x), atol=1e-5)


@pytest.mark.parametrize("kind,op", [(QuantKind.int4, _op), (QuantKind.int8, _op), (QuantKind.int4, _op_a16),
                                     (QuantKind.int8, _op_a16)], ids=["int4", "int8", "int4-a16", "int8-a16"])
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


def _tiny(kind=QuantKind.int4, group=32, seed=0):
    model = build_random_model("llama", "tiny", seed=seed)
    quantize_model(model, QuantSpec(kind, group))
    return model


def test_quantize_model_packs_every_matrix_and_shares_a_tied_table():
    model = _tiny()
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.embed_tokens.kind is QuantKind.int8
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert model.layers[0].mlp.up_proj.kind is QuantKind.int4
    if model.config.tie_word_embeddings:
        assert model.lm_head.q is model.embed_tokens.q


def test_the_weight_format_is_part_of_the_plan_key():
    a, b, c = _tiny(QuantKind.int4), _tiny(QuantKind.int8), _tiny(QuantKind.int4, group=64)
    assert a.structure()["weight_format"] == "int4/g32/a16"
    assert len({a.structure()["weight_format"], b.structure()["weight_format"], c.structure()["weight_format"]}) == 3
    plain = build_random_model("llama", "tiny", seed=0)
    before = plain.shape_key()
    quantize_model(plain, QuantSpec(QuantKind.int8))
    assert plain.shape_key() != before


def test_a_held_plan_serves_a_quantized_model_once_and_sees_a_requantization():
    from fuelpipe.context import InferenceContext

    model = _tiny(QuantKind.int8)
    ctx = InferenceContext(model)
    ctx.generate([1, 2, 3], 6)
    assert ctx.plan.stats.builds == 1  # one build for the whole generation: not over-keyed
    quantize_model(model, QuantSpec(QuantKind.int4))  # no nn.Linear left: nothing changes...
    model.layers[0].mlp.up_proj.scales.mul_(1.5)  # ...but an in-place write to a scale is seen
    ctx.generate([1, 2, 3], 2)
    assert ctx.plan.stats.builds == 2


def _quality(model, dense, fault):
    from fuelpipe.oracles.base import Setup
    from fuelpipe.driver import PlanMode
    from fuelpipe.plan.backends import BackendSpec

    spec = oracle("quant_quality")
    return execute(spec, model=model, setup=Setup(BackendSpec(), PlanMode.PLAN_ONCE), prompts=((1, 2, 3, 4), (9, 8)),
                   new_tokens=6, max_seq_len=12, other_model=lambda: None, tolerance=None, control=fault,
                   dense_model=dense)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_quality_oracle_passes_and_catches_a_wrong_scale(kind):
    dense = lambda: build_random_model("llama", "tiny", seed=0)
    model = _tiny(kind)
    ok = _quality(model, dense, False)
    assert ok.passed, ok.detail
    assert ok.metric["positions"] == 12
    bad = _quality(model, dense, True)
    assert not bad.passed and bad.fault == Fault.QUANT_WRONG_SCALE.value, bad.detail


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_every_packed_matrix_is_within_its_rounding_bound(kind):
    from fuelpipe.oracles.quant_bounds import check_model

    checks = check_model(_tiny(kind), build_random_model("llama", "tiny", seed=0), QuantSpec(kind))
    assert checks and all(c.ok for c in checks), [(c.name, c.ratio) for c in checks if not c.ok]
    assert any(c.name.startswith("quantize(") for c in checks)  # the quantizer itself ran too


def test_a_quantizer_with_the_wrong_level_count_fails_the_quality_oracle(monkeypatch):
    """Its logits stay inside the loose quality tolerances on a tiny model; the rounding bound does not."""
    from planted_gate import quantizer_sixteen_intervals

    quantizer_sixteen_intervals(monkeypatch)
    model = _tiny(QuantKind.int4)
    result = _quality(model, lambda: build_random_model("llama", "tiny", seed=0), False)
    assert not result.passed and "rounding bound" in result.detail, result.detail
    assert result.metric["bound_ratio"] > 1.5


def test_int16_activation_models_take_their_own_tolerance_and_a_wrong_path_still_fails_it():
    """vs_reference on a 16-bit-activation model: the looser max-abs tolerance of that numeric form, and the
    oracle's negative control (KV writes dropped) still fails at it."""
    from fuelpipe.driver import PlanMode
    from fuelpipe.oracles.base import Setup
    from fuelpipe.oracles.execute import numeric_form, tolerance_for
    from fuelpipe.plan.backends import BackendSpec

    model = _tiny(QuantKind.int8)
    assert numeric_form("float32", model) == "int16_activations"
    f32_act = build_random_model("llama", "tiny", seed=0)
    quantize_model(f32_act, QuantSpec(QuantKind.int8, 32, "f32"))
    assert numeric_form("float32", f32_act) == "float32"
    spec = oracle("vs_reference")
    tol = tolerance_for(spec, {"float32": 1e-5}, "int16_activations")  # a table without the key: the default
    assert tol == 1e-3
    run = lambda control: execute(spec, model=model, setup=Setup(BackendSpec(name="fx"), PlanMode.PLAN_ONCE),
                                  prompts=((1, 2, 3, 4),), new_tokens=6, max_seq_len=12, other_model=lambda: None,
                                  tolerance=tol, control=control)
    ok, bad = run(False), run(True)
    assert ok.passed, ok.detail
    assert not bad.passed and bad.fault == spec.fault.value, bad.detail


def test_quality_oracle_skips_an_unquantized_model():
    r = _quality(build_random_model("llama", "tiny", seed=0), None, False)
    assert r.skipped and "not quantized" in r.detail


@pytest.mark.parametrize("override,needle", [
    (["weights.dtype=int4", "model.dtype=bfloat16"], "needs model.dtype=float32"),
    (["weights.dtype=int8", "weights.group_size=48"], "multiple of 32"),
    (["weights.dtype=int9"], "int9"),
    (["weights.activations=int16"], "weights.activations=int16 needs weights.dtype=int8 or int4"),
    (["weights.dtype=bf16", "weights.activations=int16"], "got bf16"),
])
def test_bad_weight_settings_exit_2_naming_the_value(override, needle, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "fuelpipe", *with_tiny_model(["model=llama_tiny", *override]),
                        f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_run_counts_its_packed_matrices_as_parameters_and_names_the_stored_form(kind, tmp_path):
    """results.json ``model`` of a quantized run: as many parameters as the same model unquantized, held as
    the kind asked for (the matrices are buffers, so counting ``parameters()`` alone left only the norms)."""
    import json

    from conftest import run_cli
    from test_cli_sweep import LEAN

    dense = build_random_model("llama", "tiny", seed=0)
    want = sum(p.numel() for p in dense.parameters())
    proc = run_cli(*LEAN, "backend=eager", "experiment.bench.enabled=false", f"weights.dtype={kind}",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["model"]["n_params"] == want, proc.stdout[-2000:]
    assert doc["model"]["weights_form"].startswith(f"{kind}/g32/a16")
    assert f"{want / 1e6:.2f}M params {kind}/g32/a16" in proc.stdout


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_load_report_of_a_quantized_checkpoint_names_its_stored_form(kind, tmp_path):
    from fuelpipe.weights import load_model
    from weights_helpers import write_llama_hf_dir

    model = build_random_model("llama", "tiny", seed=0)
    path = write_llama_hf_dir(tmp_path / "ckpt", model)
    plain = load_model(path, with_tokenizer=False).report
    packed = load_model(path, with_tokenizer=False, quant=QuantSpec(kind)).report
    assert packed.n_params == plain.n_params == sum(p.numel() for p in model.parameters())
    assert "as float32 (" in plain.summary()
    assert f"params as {kind}/g32/a16" in packed.summary() and "as float32 (" not in packed.summary()
    assert packed.weights_mb < plain.weights_mb


def test_packed_siblings_are_fused_into_one_call_with_bit_identical_logits():
    """fuse_sibling_linears on a quantized model: q/k/v and gate/up become one kernel call each."""
    import torch.fx as fx

    from fuelpipe.context import InferenceContext
    from fuelpipe.plan.backends import BackendSpec
    from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
    from fuelpipe.plan.fx_passes import _fuse_packed_siblings

    model = _tiny(QuantKind.int4)
    calls = lambda gm: sum(1 for n in gm.graph.nodes if n.op == "call_function"
                           and n.target in (torch.ops.fuelpipe_kernels.q4_gemv_a16.default,
                                            torch.ops.fuelpipe_kernels.q8_gemv_a16.default))
    gm = fx.symbolic_trace(_QkvProbe(model))
    before = calls(gm)
    assert _fuse_packed_siblings(gm) == 1 and calls(gm) == before - 2  # q, k, v -> one
    fast = InferenceContext(model).generate([1, 2, 3], 6, keep_logits=True)
    # The same plan without the fusion (attention and every other op alike): only the fusion differs.
    unfused = tuple(p for p in DEFAULT_FX_PASSES if p != "fuse_sibling_linears")
    ref = InferenceContext(_tiny(QuantKind.int4), BackendSpec(name="fx", fx_passes=unfused)).generate(
        [1, 2, 3], 6, keep_logits=True)
    assert fast.tokens == ref.tokens
    assert all(torch.equal(a, b) for a, b in zip(fast.logits, ref.logits))  # each row's dot is unchanged


class _QkvProbe(torch.nn.Module):
    """The first layer's q/k/v projections of ``model`` on one input: three packed siblings."""

    def __init__(self, model):
        super().__init__()
        self.attn = model.layers[0].self_attn

    def forward(self, x):
        return self.attn.q_proj(x), self.attn.k_proj(x), self.attn.v_proj(x)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_main_job_runs_on_quantized_smollm2(kind, tmp_path):
    """The README's main command with ``weights.dtype``: generation, every oracle (quant_quality included), the bench."""
    import json
    import re

    from conftest import run_cli
    from fuelpipe.oracles.registry import ORACLES
    from fuelpipe.results import schema_problems

    proc = run_cli(f"weights.dtype={kind}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, default_model=True,
                   timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ORACLES:
        verdict = "PASS"
        assert re.search(rf"^{name}\s+{verdict}\s", proc.stdout, re.M), proc.stdout
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert schema_problems(doc) == [] and doc["status"] == "ok"
    quality = next(o for o in doc["oracles"] if o["name"] == "quant_quality")
    assert quality["metric"]["kind"] == f"{kind}/g32/a16" and quality["metric"]["positions"] > 0
    assert doc["generation"]["text"].strip()
