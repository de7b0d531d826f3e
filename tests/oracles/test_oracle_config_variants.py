"""config_variants: biases, non-dividing widths and split-sized matrices, which tiny models never reach.

It passes on every family x KV layout on fx (and its ``split`` variant really
splits), and fails under its negative control, a split GEMV that assembles its
parts in the wrong order: a bug the tiny-model gate cannot see, since no tiny
matrix is big enough to split.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from conftest import default_or_slow
import torch

from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles import config_variants
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
from fuelpipe.oracles.faulty.fx_passes import passes_under, split_weight_interleaved
from fuelpipe.plan.fx_passes import fx_pass
from fuelpipe.plan.split_gemv import MIN_SPLIT_ELEMENTS, split_gemv, split_weight
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from models.registry import build_config

GATE = [
    ("llama_tiny", "contiguous"), ("llama_tiny", "paged"), ("phi_tiny", "contiguous"), ("phi_tiny", "paged"),
    ("qwen3_tiny", "contiguous"), ("qwen3_tiny", "paged"), ("gemma3_tiny", "contiguous"), ("gemma3_tiny", "paged"),
    ("deepseek_v2_tiny", "latent"),
]
FAMILIES = [(m, kv) for m, kv in GATE if kv != "paged"]


def _cfg(compose_cfg, model, kv, *extra):
    return compose_cfg([f"model={model}", f"kv={kv}", "experiment=parity", "backend=fx", *extra])


@pytest.mark.parametrize("model,kv", default_or_slow(GATE, [("llama_tiny", "paged"), ("deepseek_v2_tiny", "latent")]))
def test_passes_on_the_gate_configs_and_splits(compose_cfg, model, kv):
    cfg = _cfg(compose_cfg, model, kv)
    result = run_one(cfg, assemble(cfg), ORACLES["config_variants"])
    print(f"\n{model} {kv}: {result.seconds:.2f}s {result.metric}")
    assert result.passed, result.detail
    assert result.metric["threads"] >= 2 and result.metric["linears_split"] > 0
    assert result.tolerance == 1e-5


@pytest.mark.parametrize("model,kv", default_or_slow(FAMILIES, [("llama_tiny", "contiguous"), ("qwen3_tiny", "contiguous")]))
def test_negative_control_fails_where_the_tiny_gate_passes(compose_cfg, model, kv):
    cfg = _cfg(compose_cfg, model, kv, "experiment.oracles.config_variants.inject_fault=true")
    control = run_one(cfg, assemble(cfg), ORACLES["config_variants"])
    assert control.negative_control and control.fault == Fault.SPLIT_PARTS_INTERLEAVED.value
    assert not control.passed and not control.detail.startswith("raised"), control.detail
    assert "reference" in control.detail

    # The same faulty pass on the tiny model itself changes nothing: no tiny matrix is big enough to split.
    blind_cfg = _cfg(compose_cfg, model, kv)
    asm = assemble(blind_cfg)
    faulty = dataclasses.replace(asm.setup.backend, fx_passes=passes_under(Fault.SPLIT_PARTS_INTERLEAVED, DEFAULT_FX_PASSES))
    asm = dataclasses.replace(asm, setup=asm.setup.with_changes(backend=faulty))
    blind = run_one(blind_cfg, asm, ORACLES["vs_reference"])
    assert blind.passed, f"vs_reference on the tiny model was expected to miss the split fault: {blind.detail}"


def test_eager_runs_the_variants_unsplit_and_says_so(compose_cfg):
    cfg = compose_cfg(["model=qwen3_tiny", "backend=eager", "experiment.new_tokens=4"])
    result = run_one(cfg, assemble(cfg), ORACLES["config_variants"])
    assert result.passed and result.metric["linears_split"] == 0
    assert "nothing splits: backend eager" in result.detail


def test_even_widths_compile_in_the_split_form_only_where_odd_widths_cannot_split():
    forms = {form: () for form in ("split_linears_across_threads", "pack_linears_into_panels")}
    traced = config_variants._traced_here
    assert traced("aot", "split", "pack_linears_into_panels", forms, 2)
    assert traced("aot", "split", "split_linears_across_threads", forms, 2)  # 8194 splits in two
    assert not traced("aot", "split", "split_linears_across_threads", forms, 4)  # 8194 does not split in four
    assert not traced("aot", "odd widths", "pack_linears_into_panels", forms, 4)
    assert not traced("fx", "split", "pack_linears_into_panels", forms, 2)
    assert not traced("aot", "split", "pack_linears_into_panels", {"": ()}, 2)  # one pass list: both compile


def test_one_thread_run_splits_at_two_and_restores_the_count(compose_cfg):
    cfg = compose_cfg(["model=llama_tiny", "experiment.new_tokens=4"])
    asm = assemble(cfg)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_one(cfg, asm, ORACLES["config_variants"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert result.passed and result.metric["threads"] == 2 and result.metric["linears_split"] > 0


def test_variants_of_a_checkpoint_config_are_small_with_biases():
    """A checkpoint's config (here SmolLM2's geometry) keeps its RoPE and tying, on the tiny geometry."""
    big = build_config("llama", "smollm2_135m")
    variants = config_variants.variant_configs(SimpleNamespace(family="llama", config=big))
    tiny = build_config("llama", "tiny")
    for name, c in variants.items():
        assert c.attention_bias and c.mlp_bias
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (
            tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads)
        assert (c.rope_theta, c.tie_word_embeddings) == (big.rope_theta, big.tie_word_embeddings)
    assert variants["split"].vocab_size * variants["split"].hidden_size >= MIN_SPLIT_ELEMENTS
    assert variants["odd widths"].intermediate_size % 2 and variants["odd widths"].vocab_size % 2


@pytest.mark.parametrize("shape", [(4096, 64), (64, 4096)])  # cols layout, rows layout
def test_interleaved_split_permutes_the_outputs(shape):
    w = torch.randn(shape)
    x = torch.randn(1, shape[1])
    right_w, cols = split_weight(w, 2)
    right = split_gemv(x, right_w, None, cols)
    torch.testing.assert_close(right, x @ w.T, rtol=1e-4, atol=1e-3)  # 4096-long sums in another order
    wrong_w, cols = split_weight_interleaved(w, 2)
    wrong = split_gemv(x, wrong_w, None, cols)
    assert not torch.allclose(wrong, right)
    torch.testing.assert_close(wrong.sort().values, right.sort().values)  # the same numbers, out of place


def test_passes_under_swaps_only_the_faulty_pass():
    assert passes_under(Fault.NONE, DEFAULT_FX_PASSES) == DEFAULT_FX_PASSES
    explicit = ("fuse_sibling_linears", "split_linears_across_threads", "pack_linears_into_panels",
                "eliminate_dead_code_keeping_writes")
    swapped = passes_under(Fault.SPLIT_PARTS_INTERLEAVED, explicit)
    assert tuple(fx_pass(p).name for p in swapped) == (
        "fuse_sibling_linears", "split_linears_across_threads_interleaved", "pack_linears_into_panels_misordered",
        "eliminate_dead_code_keeping_writes")
    assert passes_under(Fault.SPLIT_PARTS_INTERLEAVED, swapped) == swapped  # idempotent


def test_the_measured_pass_is_checked_as_each_explicit_form():
    """A form the measurement did not pick on this machine still runs (another CPU may pick it)."""
    sets = config_variants.pass_sets(DEFAULT_FX_PASSES, on_cpu=True)
    assert set(sets) == {"split_linears_across_threads", "pack_linears_into_panels", "run_linears_on_model_weights",
                         "chain_linears_on_model_weights"}
    for form, passes in sets.items():
        assert "measured_linears" not in passes and form in passes
    assert config_variants.pass_sets(DEFAULT_FX_PASSES, on_cpu=False) == {"": DEFAULT_FX_PASSES}


def test_a_config_naming_the_faulty_pass_is_refused(compose_cfg):
    """The faulty passes are not registered: a config naming one is told the passes it can name."""
    from fuelpipe.config.validate import validate

    cfg = compose_cfg(["backend.fx_passes=[fuse_sibling_linears,split_linears_across_threads_interleaved]"])
    [reason] = [r for r in validate(cfg) if "fx_passes" in r]
    assert reason.startswith("unknown backend.fx_passes entry 'split_linears_across_threads_interleaved'; "
                             "did you mean 'split_linears_across_threads'?")
    assert "interleaved" not in reason.split("available:")[1]


@pytest.mark.slow
def test_on_aot_every_form_compiles_its_odd_widths_and_the_control_is_caught(compose_cfg):
    """On a compiling backend the odd widths compile in each linear form, the even widths in the thread-split
    form (worker processes on several cores), the rest traced; the control is caught in every check."""
    cfg = compose_cfg(["model=llama_tiny", "backend=aot", "experiment.new_tokens=4"])
    result = run_one(cfg, assemble(cfg), ORACLES["config_variants"])
    assert result.passed, result.detail
    forms = config_variants.pass_sets(assemble(cfg).setup.backend.fx_passes, on_cpu=True)
    # at 2 threads the odd widths' fused gate/up (2 x 4097) splits, compiled: the even widths all run traced
    assert result.metric["threads"] == 2
    assert result.metric["variants"] == 2 * len(forms) and result.metric["compiled_checks"] == len(forms)
    assert result.detail.count("on aot;") == len(forms) and result.detail.count("on fx;") == len(forms)
    odd_split = result.detail.split("odd widths [split_linears_across_threads]: ")[1].split(";")[0]
    assert "vocab 4099, 0 linears split" not in odd_split and "on aot" in odd_split, odd_split
    assert result.builds >= len(forms)  # the workers' builds are counted here
    control_cfg = compose_cfg(["model=llama_tiny", "backend=aot", "experiment.new_tokens=4",
                               "experiment.oracles.config_variants.inject_fault=true"])
    control = run_one(control_cfg, assemble(control_cfg), ORACLES["config_variants"])
    assert not control.passed and not control.detail.startswith("raised"), control.detail
    failures = control.detail.split(" | ")[0]
    for form in forms:
        for variant in config_variants.VARIANTS:
            assert f"{variant} [{form}]: max |logits - reference|" in failures, (variant, form, failures)
