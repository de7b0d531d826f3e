"""Low-bit weights on whole models: quantize_model, the plan key, a held plan over a requantization, the
quality oracle and its negative controls, config errors and load reports (kernels: test_quant.py)."""
import pytest
import torch

from conftest import with_tiny_model
from fuelpipe.oracles.faults import Fault
from fuelpipe.kernels.build import load
from fuelpipe.oracles.execute import execute
from fuelpipe.oracles.registry import oracle
from fuelpipe.quant.formats import QuantKind, QuantSpec
from fuelpipe.quant.modules import QuantEmbedding, quantize_model
from models.registry import build_random_model

KINDS = [QuantKind.int8, QuantKind.int4, QuantKind.bf16]


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load()

def _tiny(kind=QuantKind.int4, group=32, seed=0, activations="auto"):
    model = build_random_model("llama", "tiny", seed=seed)
    quantize_model(model, QuantSpec(kind, group, activations))
    return model


def test_quantize_model_packs_every_matrix_and_shares_a_tied_table():
    model = _tiny()
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.embed_tokens.kind is QuantKind.int8
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert model.layers[0].mlp.up_proj.kind is QuantKind.int4
    if model.config.tie_word_embeddings:
        assert model.lm_head.q is model.embed_tokens.q


def test_the_activation_form_is_part_of_the_plan_key():
    a = _tiny(QuantKind.int8)
    b = build_random_model("llama", "tiny", seed=0)
    quantize_model(b, QuantSpec(QuantKind.int8, 32, "f32"))
    assert a.structure()["weight_format"] != b.structure()["weight_format"]
    assert a.shape_key() != b.shape_key()


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
    from fuelpipe.modes import PlanMode
    from fuelpipe.plan.backends import BackendSpec

    spec = oracle("quant_quality")
    return execute(spec, model=model, setup=Setup(BackendSpec(), PlanMode.plan_once), prompts=((1, 2, 3, 4), (9, 8)),
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
    from _support.planted_gate import quantizer_sixteen_intervals

    quantizer_sixteen_intervals(monkeypatch)
    model = _tiny(QuantKind.int4)
    result = _quality(model, lambda: build_random_model("llama", "tiny", seed=0), False)
    assert not result.passed and "rounding bound" in result.detail, result.detail
    assert result.metric["bound_ratio"] > 1.5


@pytest.mark.parametrize("activations,allowed", [("int16", 1e-3), ("int8", 5e-2)])
def test_integer_activation_models_take_their_own_tolerance_and_a_wrong_path_still_fails_it(activations, allowed):
    """vs_reference on a 16- or 8-bit-activation model: the looser max-abs tolerance of that numeric form, and
    the oracle's negative control (KV writes dropped) still fails at it."""
    from fuelpipe.modes import PlanMode
    from fuelpipe.oracles.base import Setup
    from fuelpipe.oracles.execute import numeric_form, tolerance_for
    from fuelpipe.plan.backends import BackendSpec

    model = _tiny(QuantKind.int8, activations=activations)
    form = f"{activations}_activations"
    assert numeric_form("float32", model) == form
    f32_act = build_random_model("llama", "tiny", seed=0)
    quantize_model(f32_act, QuantSpec(QuantKind.int8, 32, "f32"))
    assert numeric_form("float32", f32_act) == "float32"
    spec = oracle("vs_reference")
    tol = tolerance_for(spec, {"float32": 1e-5}, form)  # a table without the key: the default
    assert tol == allowed
    run = lambda control: execute(spec, model=model, setup=Setup(BackendSpec(name="fx"), PlanMode.plan_once),
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
    (["weights.activations=int8"], "weights.activations=int8 needs weights.dtype=int8 or int4"),
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
    from _support.cli_runs import LEAN

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
    from _support.weights_helpers import write_llama_hf_dir

    model = build_random_model("llama", "tiny", seed=0)
    path = write_llama_hf_dir(tmp_path / "ckpt", model)
    plain = load_model(path, with_tokenizer=False).report
    packed = load_model(path, with_tokenizer=False, quant=QuantSpec(kind)).report
    assert packed.n_params == plain.n_params == sum(p.numel() for p in model.parameters())
    assert "as float32 (" in plain.summary()
    assert f"params as {kind}/g32/a16" in packed.summary() and "as float32 (" not in packed.summary()
    assert packed.weights_mb < plain.weights_mb


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_packed_siblings_are_fused_into_one_call_with_bit_identical_logits(activations):
    """fuse_sibling_linears on a quantized model: q/k/v and gate/up become one kernel call each."""
    import torch.fx as fx

    from fuelpipe.context import InferenceContext
    from fuelpipe.plan.backends import BackendSpec
    from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
    from fuelpipe.plan.fx_passes import _fuse_packed_siblings

    model = _tiny(QuantKind.int4, activations=activations)
    tail = {"int16": "a16", "int8": "a8"}[activations]
    calls = lambda gm: sum(1 for n in gm.graph.nodes if n.op == "call_function"
                           and n.target in (getattr(torch.ops.fuelpipe_kernels, f"q4_gemv_{tail}").default,
                                            getattr(torch.ops.fuelpipe_kernels, f"q8_gemv_{tail}").default))
    gm = fx.symbolic_trace(_QkvProbe(model))
    before = calls(gm)
    assert _fuse_packed_siblings(gm) == 1 and calls(gm) == before - 2  # q, k, v -> one
    fast = InferenceContext(model).generate([1, 2, 3], 6, keep_logits=True)
    # The same plan without the fusion (attention and every other op alike): only the fusion differs.
    unfused = tuple(p for p in DEFAULT_FX_PASSES if p != "fuse_sibling_linears")
    ref = InferenceContext(_tiny(QuantKind.int4, activations=activations), BackendSpec(name="fx", fx_passes=unfused)).generate(
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
