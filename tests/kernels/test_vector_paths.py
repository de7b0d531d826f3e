"""The kernels' vector paths (fuelpipe/kernels/vector_path.h): chosen from the CPU's flags, every one the
machine runs forced in turn and checked against the readable reference, bit-identical where the arithmetic
is the same, and a path the CPU lacks refused with a typed error."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from fuelpipe.kernels.build import (
    PATH_ENV, KernelPathError, forced_vector_path, kernel_paths, load, set_vector_path, vector_path, vector_paths,
)
from fuelpipe.plan.panels import pack_panels
from fuelpipe.quant.formats import QuantKind, dequantize, quantize, round_trip_activations
from fuelpipe.quant.modules import OP_SUFFIX

A16_TOL = 2e-7  # x max|result| x sqrt(K), as tests/quant/test_quant.py: the order of f32 additions only


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load()


def _cpu_flags() -> set[str]:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _expected_paths(flags: set[str]) -> list[str]:
    paths = ["scalar"]
    if {"avx2", "fma", "f16c"} <= flags:
        paths.append("avx2")
        if "avx_vnni" in flags:
            paths.append("avx_vnni")
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            paths.append("avx512")
    return paths


def test_the_cpu_flags_decide_the_paths_and_the_best_is_taken():
    assert vector_paths() == _expected_paths(_cpu_flags())
    if not os.environ.get(PATH_ENV):
        assert vector_path() == vector_paths()[-1]
        # a kernel with several paths above avx2 takes the one measured fastest here, never above the chosen
        for kernel, path in kernel_paths().items():
            assert path in vector_paths(), (kernel, path)


def test_a_forced_path_is_taken_by_the_measured_kernels_too():
    for path in vector_paths():
        with forced_vector_path(path):
            assert set(kernel_paths().values()) == {path}


def test_the_measured_choice_is_stored_and_a_damaged_record_is_measured_again(tmp_path, monkeypatch):
    from fuelpipe.kernels import path_choice

    if len(vector_paths()) < 3:
        pytest.skip("nothing above avx2 to choose between on this CPU")
    before = kernel_paths()
    try:
        _stored_then_read_then_remeasured(path_choice, tmp_path, monkeypatch)
    finally:  # the process's kernels take their own choice again
        for kernel, path in before.items():
            torch.ops.fuelpipe_kernels.set_measured_path(kernel, path)


def _stored_then_read_then_remeasured(path_choice, tmp_path, monkeypatch):
    first = path_choice.apply(tmp_path)
    stored = json.loads((tmp_path / path_choice.FILE).read_text())
    assert stored["best"] == first and set(first) == set(path_choice.MEASURED)
    assert all(set(ms) == set(vector_paths()[1:]) for ms in stored["ms_per_layer"].values())
    measure = path_choice.measure

    def must_not_measure(paths):
        raise AssertionError("a stored choice was measured again")

    monkeypatch.setattr(path_choice, "measure", must_not_measure)
    assert path_choice.apply(tmp_path) == first  # read back, not measured again
    (tmp_path / path_choice.FILE).write_text("{not json")
    with pytest.raises(AssertionError, match="measured again"):  # a damaged record is measured again
        path_choice.apply(tmp_path)
    monkeypatch.setattr(path_choice, "measure", measure)
    assert set(path_choice.apply(tmp_path)) == set(path_choice.MEASURED)
    assert json.loads((tmp_path / path_choice.FILE).read_text())["best"]  # rewritten whole


BITS = pytest.mark.parametrize("bits", [16, 8], ids=lambda b: f"a{b}")  # *_a16 and *_a8 kernels


def _integer(kind, p, x, bits=16):
    ops = torch.ops.fuelpipe_kernels
    tail = OP_SUFFIX[bits]
    return getattr(ops, f"q8_gemv{tail}")(x, p.q, p.scales, None) if kind is QuantKind.int8 else \
        getattr(ops, f"q4_gemv{tail}")(x, p.q, p.scales, p.mins, None)


@BITS
@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4], ids=lambda k: k.value)
@pytest.mark.parametrize("k,group", [(576, 32), (1536, 32), (96, 32), (256, 64), (160, 32), (288, 96)])
def test_every_path_computes_the_integer_product_row_by_row_at_any_thread_count(kind, k, group, bits):
    """On each path: the reference within the stated order-of-additions tolerance, a row equal to itself
    decoded alone, and the same bits at 1 and 2 threads."""
    torch.manual_seed(k + group)
    p = quantize(torch.randn(203, k), kind, group)
    x = torch.randn(5, k)
    want = F.linear(round_trip_activations(x, bits), dequantize(p))
    before = torch.get_num_threads()
    for path in vector_paths():
        with forced_vector_path(path):
            assert vector_path() == path
            try:
                torch.set_num_threads(2)
                got = _integer(kind, p, x, bits)
            finally:
                torch.set_num_threads(before)
            assert float((got - want).abs().max()) <= A16_TOL * float(want.abs().max()) * k ** 0.5, path
            assert all(torch.equal(got[i], _integer(kind, p, x[i:i + 1], bits)[0]) for i in range(5)), path
            try:
                torch.set_num_threads(1)
                assert torch.equal(_integer(kind, p, x, bits), got), path
            finally:
                torch.set_num_threads(before)


@BITS
@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4], ids=lambda k: k.value)
@pytest.mark.parametrize("k,group", [(576, 32), (96, 32), (256, 64), (160, 32)])
def test_a_weight_row_gives_the_same_bits_in_a_tile_of_rows_and_alone(kind, k, group, bits):
    """The 256-bit paths run the rows a thread walks in lockstep as one tile (quant_a16_tiles.h, quant_a8.cpp);
    a row's result is its own one-row function's, bit for bit, whichever rows share its tile and at any thread
    count (K = 160: five blocks, an odd last one on the 8-bit 4-bit pairs)."""
    torch.manual_seed(k)
    p = quantize(torch.randn(203, k), kind, group)
    x = torch.randn(2, k)
    before = torch.get_num_threads()
    for path in vector_paths():
        with forced_vector_path(path):
            alone = torch.cat([_integer(kind, _one_row(p, n), x, bits) for n in range(203)], dim=1)  # N = 1: no tile
            try:
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    assert torch.equal(_integer(kind, p, x, bits), alone), (path, threads)
            finally:
                torch.set_num_threads(before)


def test_int8_weights_of_minus_128_against_full_scale_activations_are_exact_on_every_path():
    """A GGUF Q8_0 block may hold -128 (fuelpipe's own quantizer stops at -127). Against 8-bit activations at
    their largest codes it is the tightest case for the 8-bit products (|w| = 128 enters VPMADDUBSW unsigned: a pair
    sums to 2 * 128 * 127, just inside int16), and the exact answer is known: every product is +-128 * code."""
    from fuelpipe.quant.formats import PackedWeight

    k = 96
    q = torch.full((5, k), -128, dtype=torch.int8)
    q[1, ::2] = 127
    scales = torch.full((5, k // 32), 0.5, dtype=torch.float16)
    x = torch.full((2, k), 127.0)  # the step is exactly 1, every code +-127
    x[1, 1::2] = -127.0  # alternating signs in row 1
    p = PackedWeight(QuantKind.int8, q, scales)
    # Every product is a multiple of 1/2 (code * w * 0.5, w = -128 or 127) and every sum stays below 2^22,
    # so the answer is exact in f32 whatever the order of additions.
    want = F.linear(round_trip_activations(x, 8), dequantize(p))
    for path in vector_paths():
        with forced_vector_path(path):
            assert torch.equal(_integer(QuantKind.int8, p, x, 8), want), path


@BITS
@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4], ids=lambda k: k.value)
def test_a_non_finite_activation_reaches_its_row_on_every_path(kind, bits):
    torch.manual_seed(6)
    p = quantize(torch.randn(40, 160), kind, 32)
    x = torch.randn(3, 160)
    x[1, 150] = float("nan")
    for path in vector_paths():
        with forced_vector_path(path):
            out = _integer(kind, p, x, bits)
        assert bool(torch.isnan(out[1]).all()) and bool(torch.isfinite(out[[0, 2]]).all()), path


def _one_row(p, n):
    from dataclasses import replace

    return replace(p, q=p.q[n:n + 1], scales=p.scales[n:n + 1], mins=None if p.mins is None else p.mins[n:n + 1])


@BITS
@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4], ids=lambda k: k.value)
def test_a_wrong_path_fails_the_tolerance_the_paths_are_held_to(kind, bits):
    """Negative control for the test above: a product whose last block is dropped is far outside it."""
    torch.manual_seed(2)
    p = quantize(torch.randn(64, 576), kind, 32)
    x = torch.randn(3, 576)
    want = F.linear(round_trip_activations(x, bits), dequantize(p))
    dropped = x.clone()
    dropped[:, -32:] = 0
    for path in vector_paths():
        with forced_vector_path(path):
            got = _integer(kind, p, dropped, bits)
        assert float((got - want).abs().max()) > A16_TOL * float(want.abs().max()) * 576 ** 0.5, path


@pytest.mark.parametrize("kind", [QuantKind.int8, QuantKind.int4], ids=lambda k: k.value)
def test_avx_vnni_gives_the_avx2_bits(kind):
    """VPDPWSSD fuses the add of a block's two halves: integer sums, so the same bits as AVX2."""
    if "avx_vnni" not in vector_paths():
        pytest.skip("this CPU has no AVX-VNNI")
    torch.manual_seed(4)
    p = quantize(torch.randn(300, 1536), kind, 32)
    x = torch.randn(3, 1536)
    with forced_vector_path("avx2"):
        avx2 = _integer(kind, p, x)
    with forced_vector_path("avx_vnni"):
        vnni = _integer(kind, p, x)
    assert torch.equal(avx2, vnni)


@pytest.mark.parametrize("k", [1, 7, 9, 33, 576])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 16])  # avx512 pairs rows of x: even, odd, 4 pairs and beyond
def test_the_f32_kernels_give_the_same_bits_on_every_path(k, m):
    """f32_rows (8 lanes in a fixed tree) and f32_panels (one chain over k) state their summation order; each
    path follows it, so the scalar path's bits are the vector paths' bits."""
    torch.manual_seed(k * 10 + m)
    ops = torch.ops.fuelpipe_kernels
    x, parts, bias = torch.randn(m, k), [torch.randn(19, k), torch.randn(6, k)], torch.randn(25)
    panels = pack_panels(parts[0])
    outs = {}
    for path in vector_paths():
        with forced_vector_path(path):
            outs[path] = (ops.f32_rows_linear(x, parts, bias), ops.f32_rows_chain_linear(x, parts, bias),
                          ops.f32_panel_linear(x, panels, 19, None))
    first = outs["scalar"]
    for path, got in outs.items():
        assert all(torch.equal(a, b) for a, b in zip(got, first)), path
    want = F.linear(x.double(), torch.cat(parts).double(), bias.double())
    assert torch.allclose(first[0].double(), want, rtol=1e-5, atol=1e-5)


def test_a_path_this_cpu_cannot_run_is_a_typed_error_naming_the_value_and_the_choices():
    before = vector_path()
    with pytest.raises(KernelPathError) as err:
        set_vector_path("avx1024")
    text = str(err.value)
    assert "avx1024" in text and "scalar" in text and vector_paths()[-1] in text
    assert vector_path() == before  # nothing changed


def test_a_forced_path_is_restored_after_the_block_even_on_error():
    before, measured = vector_path(), kernel_paths()
    with pytest.raises(ZeroDivisionError):
        with forced_vector_path("scalar"):
            assert vector_path() == "scalar"
            1 / 0
    assert vector_path() == before
    with forced_vector_path(vector_paths()[-1]):  # forcing the best path overrides the measured choices ...
        assert set(kernel_paths().values()) == {vector_paths()[-1]}
    assert kernel_paths() == measured  # ... and leaving the block gives them back


def test_the_environment_forces_a_path_and_a_bad_one_is_a_config_error_at_load():
    code = "from fuelpipe.kernels.build import vector_path; print(vector_path())"
    env = dict(os.environ, **{PATH_ENV: "scalar"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "scalar", out.stderr[-2000:]
    env[PATH_ENV] = "sse9"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "KernelPathError" in out.stderr and PATH_ENV in out.stderr and "sse9" in out.stderr
    again = ("from fuelpipe.kernels.build import KernelPathError, load\n"
             "for _ in range(2):\n"
             "    try:\n        load(); print('loaded')\n"
             "    except KernelPathError:\n        print('refused')")
    out = subprocess.run([sys.executable, "-c", again], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["refused", "refused"], out.stdout + out.stderr[-2000:]  # never silently on auto
