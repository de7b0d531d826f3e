"""kernel_parity: passes on the built kernels, and fails when its reference is wrong in each class it exists for.

The negative control (``Fault.KERNEL_TAIL_DROPPED``) runs with every oracle's in
tests/oracles/test_oracles_controls.py; the bugs planted in the C++ sources themselves
run in tests/kernels/planted_kernels.py (slow: each compiles its own copy of the kernels).
Here the readable side is made wrong instead, in-process, one class at a time: the
kernel and its reference are compared the same way whichever side is wrong.
"""
from __future__ import annotations

import pytest
import torch

import fuelpipe.kv.slot_attention as readable_attention
from fuelpipe.kernels.build import vector_paths
from fuelpipe.oracles.kernel_parity import PATHS_OF_KERNEL
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.quant import formats
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one

KERNELS = ("q8_gemv", "q4_gemv", "q8_gemv_a16", "q4_gemv_a16", "q8_gemv_a8", "q4_gemv_a8", "bf16_gemv", "f32_panel_linear", "f32_rows_linear",
           "f32_rows_chain_linear", "slot_attention")


@pytest.fixture(scope="module")
def gate():
    """run(overrides) -> kernel_parity's result on the tiny model."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conftest import CONF, VERSION_BASE

    def _run(overrides=()):
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONF), version_base=VERSION_BASE):
            cfg = compose("config", overrides=["model=llama_tiny", "backend=eager", *overrides])
        GlobalHydra.instance().clear()
        return run_one(cfg, assemble(cfg), ORACLES["kernel_parity"])

    return _run


def _failed_kernels(result) -> set[str]:
    return {name for name, ratio in result.metric["worst_ratio"].items() if ratio > 1.0}


def test_every_kernel_passes_within_its_bound(gate):
    result = gate()
    assert result.passed, result.detail
    assert set(result.metric["worst_ratio"]) == set(KERNELS)
    assert result.metric["vector_path"] == result.metric["vector_paths"][-1]  # the best this CPU runs
    assert result.metric["vector_paths"] == vector_paths() and result.metric["vector_paths"][0] == "scalar"
    for path, worst in result.metric["worst_ratio_by_path"].items():  # each kernel on every path it has
        assert set(worst) == {k for k in KERNELS if path in PATHS_OF_KERNEL[k]}, (path, worst)
        assert all(0.0 < r <= 1.0 for r in worst.values()), (path, worst)
    assert all(0.0 < r <= 1.0 for r in result.metric["worst_ratio"].values()), result.metric
    # odd block counts (1, 3, 5 blocks of 32) and the model's own in_features (64) one block either side
    assert {32, 96, 160, 64 - 32, 64 + 32} <= set(result.metric["quant_k"])


def test_its_own_fault_fails_every_kernel(gate):
    result = gate(["experiment.oracles.kernel_parity.inject_fault=true"])
    assert not result.passed and result.fault == "kernel_tail_dropped"
    assert _failed_kernels(result) == set(KERNELS), result.metric
    for path, worst in result.metric["worst_ratio_by_path"].items():  # caught on every path, not on one
        assert all(r > 1.0 for r in worst.values()), (path, worst)


def test_a_reference_step_one_code_off_fails_the_16_bit_kernels_only(gate, monkeypatch):
    monkeypatch.setattr(formats, "ACT_LEVELS", formats.ACT_LEVELS - 1)  # step max|x| / 32766
    result = gate()
    assert not result.passed
    assert _failed_kernels(result) == {"q8_gemv_a16", "q4_gemv_a16"}, result.metric


def test_a_reference_step_one_code_off_at_8_bits_fails_the_8_bit_kernels_only(gate, monkeypatch):
    monkeypatch.setattr(formats, "ACT8_LEVELS", formats.ACT8_LEVELS - 1)  # step max|x| / 126
    result = gate()
    assert not result.passed
    assert _failed_kernels(result) == {"q8_gemv_a8", "q4_gemv_a8"}, result.metric


def test_a_reference_without_an_odd_rows_last_block_fails_the_low_bit_kernels(gate, monkeypatch):
    right = formats.dequantize

    def odd_tail_dropped(p):
        w = right(p)
        if (w.shape[-1] // formats.BLOCK) % 2:
            w[:, -formats.BLOCK:] = 0.0
        return w

    monkeypatch.setattr(formats, "dequantize", odd_tail_dropped)
    result = gate()
    assert _failed_kernels(result) == {"q8_gemv", "q4_gemv", "q8_gemv_a16", "q4_gemv_a16", "q8_gemv_a8", "q4_gemv_a8"}, \
        result.metric


def test_a_reference_that_never_reads_the_last_slot_fails_slot_attention(gate, monkeypatch):
    right = readable_attention.slot_attention

    def last_slot_unread(q, k_buf, v_buf, slot_ids, mask, scale):
        mask = mask.clone()
        mask[..., -1] = float("-inf")
        out = right(q, k_buf, v_buf, slot_ids, mask, scale)
        return torch.nan_to_num(out, nan=0.0)  # a row whose one live slot was the last: nothing attendable

    monkeypatch.setattr(readable_attention, "slot_attention", last_slot_unread)
    result = gate()
    assert _failed_kernels(result) == {"slot_attention"}, result.metric
